//! What a call sends the functions and the module: its header (whose clock, the cost, what a
//! settlement does) and each tier's arguments, as little-endian doubles.

use crate::layout::{Header, header, packed, tier};
use crate::rule::Rule;
use crate::store::Settle;

/// Whose clock the Redis functions decide at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreTime {
    /// The Redis server's `TIME`: instances whose clocks disagree still agree on windows.
    #[default]
    Server,
    /// The limiter's own clock, sent with each check: for tests on a manual clock. Keys then
    /// live a minute longer by the server's clock than the limiter's clock says they must.
    Local,
}

/// Added to every TTL when functions decide at the caller's time (see [`StoreTime::Local`]).
const CALLER_TIME_TTL_PADDING_MS: u64 = 60_000;

/// The header of a call (see `lua/prelude.lua`): the caller's time at `now` (µs) or -1 for the
/// server's `TIME`, the cost, the longest delay accepted, the TTL padding (ms: the caller's
/// clock's, plus `jitter`), and what a settlement does.
pub(super) fn header(
    time: StoreTime,
    jitter: u64,
    now: u64,
    cost: u64,
    max_delay: Option<u64>,
    settle: Option<Settle>,
) -> [u8; header::BYTES] {
    let (at, padding) = match time {
        StoreTime::Server => (None, 0),
        StoreTime::Local => (Some(now), CALLER_TIME_TTL_PADDING_MS),
    };
    Header {
        at,
        cost,
        max_delay,
        ttl_padding: padding + jitter,
        settle,
    }
    .encode()
}

/// A rule's tiers as the functions read them (see `layout::tier`).
pub(crate) fn tier_args(rule: &Rule) -> Vec<u8> {
    let algorithm = rule.algorithm();
    let mut args = Vec::with_capacity(tier::BYTES * rule.tiers().len());
    for (i, t) in rule.tiers().iter().enumerate() {
        let rate = t.rate();
        // Every integer is below 2^53, so the doubles carry it exactly.
        let mut fields = [0.0; tier::DOUBLES];
        fields[tier::LIMIT] = t.limit() as f64;
        fields[tier::PERIOD] = t.period_micros() as f64;
        fields[tier::BURST] = t.burst() as f64;
        fields[tier::PER_PERMIT] = rate.per_permit as f64;
        fields[tier::PER_MICRO] = rate.per_micro as f64;
        fields[tier::WORDS] = rule.tier_words(i).len() as f64;
        fields[tier::PARAMETERS..]
            .copy_from_slice(&crate::algorithm::Decide::script_parameters(algorithm, t));
        args.extend(packed(fields));
    }
    args
}
