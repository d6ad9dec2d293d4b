//! What a Redis store, its Lua library and tollgate's Redis module exchange, named once:
//! every call's header, each tier's arguments, a batch's items, the verdicts of a reply and a
//! key's stored state, all little-endian doubles; and the list of algorithms, whose place in
//! it is the index batches and the module name an algorithm by. No I/O.
//!
//! The Lua library reads the same names from `store/redis/lua/layout.lua`, which [`lua`]
//! writes from this file: a test fails when the two differ (`TOLLGATE_BLESS=1 cargo test -p
//! tollgate --lib layout` writes it again). Every quantity is an integer below 2^53, so a
//! double carries it exactly.

use crate::algorithm::{Algorithm, Settle, Verdict};

/// Bytes of one value: a little-endian double.
pub(crate) const DOUBLE: usize = 8;

/// A call's header: `args[1]` of every check and settlement, and the module's check argument.
pub(crate) mod header {
    /// µs since the Unix epoch on the caller's clock; -1: the server's `TIME`.
    pub(crate) const AT: usize = 0;
    /// Permits; 0 looks without consuming.
    pub(crate) const COST: usize = 1;
    /// The longest delay a shaper may answer, µs; -1: none given.
    pub(crate) const MAX_DELAY: usize = 2;
    /// ms added to every TTL written (the caller's clock's margin, and the expiry jitter).
    pub(crate) const TTL_PADDING: usize = 3;
    /// What a settlement does: see [`super::settle`].
    pub(crate) const SETTLE: usize = 4;
    /// When a credit's cost was taken, µs.
    pub(crate) const CREDIT_AT: usize = 5;
    /// Doubles in a header.
    pub(crate) const DOUBLES: usize = 6;
    /// Bytes of a header.
    pub(crate) const BYTES: usize = DOUBLES * super::DOUBLE;
}

/// What a settlement does, in a header's [`header::SETTLE`].
pub(crate) mod settle {
    /// None: a check.
    pub(crate) const CHECK: u8 = 0;
    /// A report: takes the cost whatever the state.
    pub(crate) const REPORT: u8 = 1;
    /// A credit: gives back the cost taken at [`super::header::CREDIT_AT`].
    pub(crate) const CREDIT: u8 = 2;
    /// A renewal of slots held.
    pub(crate) const RENEW: u8 = 3;
}

/// One tier's arguments (`args[2]` of a check, one per tier in order).
pub(crate) mod tier {
    /// Permits per period.
    pub(crate) const LIMIT: usize = 0;
    /// µs.
    pub(crate) const PERIOD: usize = 1;
    /// Permits at once.
    pub(crate) const BURST: usize = 2;
    /// Units of one permit (the exact rate: see `algorithm/rate.rs`).
    pub(crate) const PER_PERMIT: usize = 3;
    /// Units drained per µs.
    pub(crate) const PER_MICRO: usize = 4;
    /// State words of this tier.
    pub(crate) const WORDS: usize = 5;
    /// The first of the algorithm's own parameters (`p1`..`p5`, see
    /// `Decide::script_parameters`); a calendar tier's window bounds and 1.
    pub(crate) const PARAMETERS: usize = 6;
    /// How many parameters.
    pub(crate) const PARAMETER_COUNT: usize = 5;
    /// Doubles per tier.
    pub(crate) const DOUBLES: usize = PARAMETERS + PARAMETER_COUNT;
    /// Bytes per tier.
    pub(crate) const BYTES: usize = DOUBLES * super::DOUBLE;
}

/// One tier's verdict in a reply: the reply holds one per tier of every item, in order.
pub(crate) mod verdict {
    /// 1 admitted, 0 denied.
    pub(crate) const ALLOWED: usize = 0;
    /// Permits.
    pub(crate) const LIMIT: usize = 1;
    /// Permits.
    pub(crate) const REMAINING: usize = 2;
    /// µs.
    pub(crate) const RESET_AFTER: usize = 3;
    /// µs.
    pub(crate) const RETRY_AFTER: usize = 4;
    /// µs a shaper asks to wait.
    pub(crate) const DELAY: usize = 5;
    /// Doubles per verdict.
    pub(crate) const DOUBLES: usize = 6;
    /// Bytes per verdict.
    pub(crate) const BYTES: usize = DOUBLES * super::DOUBLE;
}

/// A batch's description (`args[2]` of the batch function): one double saying what the call
/// does ([`batch::DECIDE`] or [`batch::LOOK`]), then [`batch::ITEM`] doubles per item.
pub(crate) mod batch {
    /// Decides: writes the costs if every item admits.
    pub(crate) const DECIDE: u8 = 0;
    /// Asks every item, writing nothing.
    pub(crate) const LOOK: u8 = 1;
    /// An item's algorithm: its index (see [`super::index`]).
    pub(crate) const ALGORITHM: usize = 0;
    /// An item's cost.
    pub(crate) const COST: usize = 1;
    /// 1 when the item's rule is in shadow mode.
    pub(crate) const SHADOW: usize = 2;
    /// How many keys the item has.
    pub(crate) const KEYS: usize = 3;
    /// Doubles per item.
    pub(crate) const ITEM: usize = 4;
}

/// The hybrid and lease stores' counters (`lua/counters.lua`): doubles per item of each call,
/// and per item of each reply (after the reply's first double, the time).
pub(crate) mod counters {
    /// An add's item: delta, TTL (ms) of a counter it creates.
    pub(crate) const ADD: usize = 2;
    /// A lease's item: want, need, limit, TTL (ms), threshold, rate (per s), window end (µs),
    /// stale (µs).
    pub(crate) const LEASE: usize = 8;
    /// A claim's item: kind, delta, TTL (ms), limit, want, keep, claim TTL (µs), period (µs),
    /// window start (µs).
    pub(crate) const CLAIM: usize = 9;
    /// An add's answer per item: the count after.
    pub(crate) const ADDED: usize = 1;
    /// A lease's answer per item: granted, counted after.
    pub(crate) const LEASED: usize = 2;
    /// A claim's answer per item: count, others' claims, claim, claimers, previous count.
    pub(crate) const CLAIMED: usize = 5;
}

/// Global rules' counts across regions (`lua/regions.lua`): doubles of each call's parts and
/// of each reply's, after the reply's first double (always 0).
pub(crate) mod regions {
    /// What a check does: looks (writes nothing).
    pub(crate) const LOOK: u8 = 0;
    /// Decides, all-or-nothing, and takes the cost where every tier admits.
    pub(crate) const CHECK: u8 = 1;
    /// Takes the cost whatever the counts say (a metered report).
    pub(crate) const REPORT: u8 = 2;
    /// Gives the cost back (a credit), counted as given back in this region.
    pub(crate) const CREDIT: u8 = 3;
    /// A check's head: mode, peers, reply width per item.
    pub(crate) const HEAD: usize = 3;
    /// An item's head: cost, shadow (1/0), tiers, on partition (0 share, 1 region), the
    /// peers unheard past the rule's `stale_after` (bit `p` for peer `p`, from 0).
    pub(crate) const ITEM: usize = 5;
    /// A tier's head: limit, in-flight allowance, buckets, the current bucket's TTL (ms);
    /// then one weight per bucket, the current bucket last.
    pub(crate) const TIER: usize = 4;
    /// A check's answer per item: admitted (1/0), a stale peer's share counted (1/0); then
    /// [`TIER_ANSWER`] per tier.
    pub(crate) const ITEM_ANSWER: usize = 2;
    /// A tier's answer: the merged count before the check, this region's permits not yet
    /// confirmed by every live peer, why denied (0 not, 1 the limit, 2 in flight).
    pub(crate) const TIER_ANSWER: usize = 3;
    /// A sync's item (this region's side): TTL (ms), then per peer what its last merge
    /// answered: this region's `+` it holds, its own `+` and `-` (-1: none).
    pub(crate) const SYNC: usize = 1;
    /// Per peer, in a sync's item.
    pub(crate) const SYNC_PEER: usize = 3;
    /// A sync's answer per item: this region's `+` and `-`.
    pub(crate) const SYNCED: usize = 2;
    /// A merge's item (the peer's side): the sender's `+` and `-`, TTL (ms).
    pub(crate) const MERGE: usize = 3;
    /// A merge's answer per item: the sender's `+` held, the receiver's own `+` and `-`.
    pub(crate) const MERGED: usize = 3;
}

/// The reservations' book (`lua/reservations.lua`, `lua/metered.lua`).
pub(crate) mod book {
    /// A record kept: its expiry (µs), the record's TTL (ms), the most records kept.
    pub(crate) const KEEP: usize = 3;
    /// A commit: the actual cost, now (µs).
    pub(crate) const COMMIT: usize = 2;
    /// Expired records asked for: now (µs), the most to return.
    pub(crate) const EXPIRED: usize = 2;
}

/// How an algorithm keeps its state on Redis, and so which Lua driver runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Its words, every tier's in order, one double each, in one string key; the module
    /// decides it too.
    Words,
    /// One sorted set per tier; the Lua library alone decides it.
    Log,
}

/// One algorithm as Redis knows it.
#[derive(Debug)]
pub(crate) struct Listed {
    /// Its name: its Lua file's (`store/redis/lua/<name>.lua`) and function's, as
    /// [`Algorithm::name`] says (one name for both leaky buckets).
    pub(crate) name: &'static str,
    /// How its state is kept.
    pub(crate) kept: Kept,
    /// The algorithm of its parameters in the module's rule argument (see
    /// `Decide::module_parameters`).
    pub(crate) of: fn([f64; 2]) -> Result<Algorithm, &'static str>,
    /// Its Lua code.
    pub(crate) lua: &'static str,
}

/// The table of algorithms: each row its name, how its state is kept, and its decoder; its
/// Lua file is found by its name.
macro_rules! algorithms {
    ($($name:literal, $kept:ident, $of:expr;)*) => {
        /// Every algorithm as Redis knows it; its index is its place here, from 1. To add an
        /// algorithm: its file in `algorithm/` and its arm in [`Algorithm`], its Lua file
        /// `store/redis/lua/<name>.lua`, and its row here (docs/operating.md, "Adding an
        /// algorithm").
        pub(crate) const ALGORITHMS: &[Listed] = &[$(Listed {
            name: $name,
            kept: Kept::$kept,
            of: $of,
            lua: include_str!(concat!("store/redis/lua/", $name, ".lua")),
        }),*];
    };
}

algorithms! {
    "fixed_window", Words, |_| Ok(Algorithm::FixedWindow);
    "sliding_window", Words, |_| Ok(Algorithm::SlidingWindow);
    "sub_windows", Words, crate::algorithm::sub_windows_of;
    "sliding_log", Log, |_| Ok(Algorithm::SlidingLog);
    "token_bucket", Words, crate::algorithm::token_bucket_of;
    "interval_bucket", Words, |_| Ok(Algorithm::IntervalBucket);
    "leaky_bucket", Words, crate::algorithm::leaky_bucket_of;
    "gcra", Words, |_| Ok(Algorithm::Gcra);
    "warm_up", Words, crate::algorithm::warm_up_of;
    "hit_counter", Words, |_| Ok(Algorithm::HitCounter);
    "concurrency", Words, |_| Ok(Algorithm::Concurrency);
}

/// The name Redis knows `algorithm` by: its own, but one for both leaky buckets.
fn listed_name(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::LeakyBucket(_) => "leaky_bucket",
        other => other.name(),
    }
}

/// `algorithm`'s index: its place in [`ALGORITHMS`], from 1.
pub(crate) fn index(algorithm: &Algorithm) -> usize {
    let name = listed_name(algorithm);
    ALGORITHMS
        .iter()
        .position(|listed| listed.name == name)
        .map_or(0, |i| i + 1)
}

/// How `algorithm`'s state is kept on Redis.
pub(crate) fn kept(algorithm: &Algorithm) -> Kept {
    ALGORITHMS[index(algorithm) - 1].kept
}

/// Little-endian doubles, eight bytes each.
pub(crate) fn packed<const N: usize>(values: [f64; N]) -> Vec<u8> {
    let mut bytes = vec![0; DOUBLE * N];
    pack_into(&mut bytes, &values);
    bytes
}

/// Writes `values` into `bytes` as [`packed`] does, eight bytes each from the start.
pub(crate) fn pack_into(bytes: &mut [u8], values: &[f64]) {
    for (at, value) in bytes.chunks_exact_mut(DOUBLE).zip(values) {
        at.copy_from_slice(&value.to_le_bytes());
    }
}

/// Little-endian doubles, or `None` when `bytes` is not a whole number of them.
pub(crate) fn doubles(bytes: &[u8]) -> Option<impl ExactSizeIterator<Item = f64> + '_> {
    bytes.len().is_multiple_of(DOUBLE).then(|| {
        bytes
            .chunks_exact(DOUBLE)
            .map(|c| f64::from_le_bytes(c.try_into().expect("eight bytes")))
    })
}

/// A header's fields: the caller's time (`None` for the server's), the cost, the longest
/// delay accepted, the TTL padding (ms) and what a settlement does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Header {
    /// µs since the Unix epoch; `None`: the server's `TIME`.
    pub(crate) at: Option<u64>,
    pub(crate) cost: u64,
    /// µs.
    pub(crate) max_delay: Option<u64>,
    /// ms.
    pub(crate) ttl_padding: u64,
    pub(crate) settle: Option<Settle>,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; header::BYTES] {
        let (settle, credit_at) = match self.settle {
            None => (settle::CHECK, 0.0),
            Some(Settle::Report) => (settle::REPORT, 0.0),
            Some(Settle::Credit { at }) => (settle::CREDIT, at as f64),
            Some(Settle::Renew) => (settle::RENEW, 0.0),
        };
        let mut fields = [0.0; header::DOUBLES];
        fields[header::AT] = self.at.map_or(-1.0, |at| at as f64);
        fields[header::COST] = self.cost as f64;
        fields[header::MAX_DELAY] = self.max_delay.map_or(-1.0, |d| d as f64);
        fields[header::TTL_PADDING] = self.ttl_padding as f64;
        fields[header::SETTLE] = f64::from(settle);
        fields[header::CREDIT_AT] = credit_at;
        let mut bytes = [0; header::BYTES];
        pack_into(&mut bytes, &fields);
        bytes
    }

    /// The header of `bytes`, its quantities whole numbers below 2^53 as [`whole`] reads them.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, &'static str> {
        let mut d = [0.0; header::DOUBLES];
        let given = doubles(bytes)
            .filter(|given| given.len() == header::DOUBLES)
            .ok_or("the check argument is not six doubles")?;
        d.iter_mut().zip(given).for_each(|(d, given)| *d = given);
        let settle = match d[header::SETTLE] {
            0.0 => None,
            1.0 => Some(Settle::Report),
            2.0 => Some(Settle::Credit {
                at: whole(d[header::CREDIT_AT])?,
            }),
            3.0 => Some(Settle::Renew),
            _ => return Err("no such settlement"),
        };
        let optional = |x: f64| {
            if x < 0.0 {
                Ok(None)
            } else {
                whole(x).map(Some)
            }
        };
        Ok(Self {
            at: optional(d[header::AT])?,
            cost: whole(d[header::COST])?,
            max_delay: optional(d[header::MAX_DELAY])?,
            ttl_padding: whole(d[header::TTL_PADDING])?,
            settle,
        })
    }
}

/// A whole number below 2^53, as every quantity of the layout is.
pub(crate) fn whole(x: f64) -> Result<u64, &'static str> {
    if x >= 0.0 && x < crate::algorithm::MAX_EXACT as f64 && x.fract() == 0.0 {
        Ok(x as u64)
    } else {
        Err("a quantity is not a whole number below 2^53")
    }
}

/// A verdict's doubles.
pub(crate) fn encode_verdict(v: &Verdict) -> [f64; verdict::DOUBLES] {
    let mut fields = [0.0; verdict::DOUBLES];
    fields[verdict::ALLOWED] = f64::from(u8::from(v.allowed));
    fields[verdict::LIMIT] = v.limit as f64;
    fields[verdict::REMAINING] = v.remaining as f64;
    fields[verdict::RESET_AFTER] = v.reset_after as f64;
    fields[verdict::RETRY_AFTER] = v.retry_after as f64;
    fields[verdict::DELAY] = v.delay as f64;
    fields
}

/// The verdict of one tier's bytes in a reply ([`verdict::BYTES`] of them).
pub(crate) fn decode_verdict(bytes: &[u8]) -> Verdict {
    let field = |i: usize| {
        let at = DOUBLE * i;
        f64::from_le_bytes(bytes[at..at + DOUBLE].try_into().expect("eight bytes")) as u64
    };
    Verdict {
        allowed: field(verdict::ALLOWED) == 1,
        limit: field(verdict::LIMIT),
        remaining: field(verdict::REMAINING),
        reset_after: field(verdict::RESET_AFTER),
        retry_after: field(verdict::RETRY_AFTER),
        delay: field(verdict::DELAY),
    }
}

/// The Lua library's copy of this layout: `store/redis/lua/layout.lua`.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn lua() -> String {
    let doubles = |n: usize| format!("'<{}'", "d".repeat(n));
    let mut out = String::from(
        "-- The layout of what the store, this library and tollgate's module exchange, \
         written from\n-- src/layout.rs (TOLLGATE_BLESS=1 cargo test -p tollgate --lib \
         layout): do not edit.\n",
    );
    let mut line = |comment: &str, names: &[&str], values: &[String]| {
        out.push_str(&format!(
            "-- {comment}\nlocal {} = {}\n",
            names.join(", "),
            values.join(", ")
        ));
    };
    line(
        "A call's header: now (µs; -1 the server's TIME), cost, max_delay (µs; -1 none), \
         ttl_padding (ms),\n-- settle, credit_at (µs).",
        &["HEADER_FORMAT"],
        &[doubles(header::DOUBLES)],
    );
    line(
        "What a settlement does (the header's settle; else a credit).",
        &["SETTLE_REPORT", "SETTLE_RENEW"],
        &[settle::REPORT, settle::RENEW].map(|v| v.to_string()),
    );
    line(
        "A tier's arguments: limit, period (µs), burst, per_permit, per_micro, state words, \
         p1..p5.",
        &["TIER_FORMAT", "TIER_BYTES"],
        &[doubles(tier::DOUBLES), tier::BYTES.to_string()],
    );
    line(
        "A tier's verdict: allowed (1/0), limit, remaining, reset_after (µs), retry_after \
         (µs), delay (µs).",
        &["VERDICT_DOUBLES"],
        &[verdict::DOUBLES.to_string()],
    );
    line(
        "The counters' items: an add's, a lease's, a claim's (see layout.rs, counters).",
        &["ADD_FORMAT", "LEASE_FORMAT", "CLAIM_FORMAT"],
        &[
            doubles(counters::ADD),
            doubles(counters::LEASE),
            doubles(counters::CLAIM),
        ],
    );
    line(
        "The book's arguments: a record kept, a commit, expired records asked for.",
        &["KEEP_FORMAT", "COMMIT_FORMAT", "EXPIRED_FORMAT"],
        &[
            doubles(book::KEEP),
            doubles(book::COMMIT),
            doubles(book::EXPIRED),
        ],
    );
    line(
        "Global rules (regions.lua): a check's modes, head, item, tier and answers; a \
         sync's and\n-- a merge's items and answers (see layout.rs, regions).",
        &[
            "REGIONS_LOOK",
            "REGIONS_CHECK",
            "REGIONS_REPORT",
            "REGIONS_CREDIT",
            "REGIONS_HEAD",
            "REGIONS_ITEM",
            "REGIONS_TIER",
            "REGIONS_ITEM_ANSWER",
            "REGIONS_TIER_ANSWER",
            "REGIONS_SYNC",
            "REGIONS_SYNC_PEER",
            "REGIONS_SYNCED",
            "REGIONS_MERGE",
            "REGIONS_MERGED",
        ],
        &[
            regions::LOOK as usize,
            regions::CHECK as usize,
            regions::REPORT as usize,
            regions::CREDIT as usize,
            regions::HEAD,
            regions::ITEM,
            regions::TIER,
            regions::ITEM_ANSWER,
            regions::TIER_ANSWER,
            regions::SYNC,
            regions::SYNC_PEER,
            regions::SYNCED,
            regions::MERGE,
            regions::MERGED,
        ]
        .map(|v| v.to_string()),
    );
    line(
        "A batch's description: what it does (BATCH_LOOK asks and writes nothing), then per \
         item its\n-- algorithm's index, cost, shadow (1/0) and number of keys.",
        &["BATCH_LOOK", "BATCH_FORMAT", "ITEM_FORMAT"],
        &[batch::LOOK.to_string(), doubles(1), doubles(batch::ITEM)],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Decide as _;

    #[test]
    fn the_lua_library_reads_this_layout() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/redis/lua/layout.lua"
        );
        let written = std::fs::read_to_string(path).unwrap_or_default();
        let made = lua();
        if std::env::var_os("TOLLGATE_BLESS").is_some() {
            std::fs::write(path, &made).unwrap();
            return;
        }
        assert!(
            written == made,
            "store/redis/lua/layout.lua is not what src/layout.rs makes: run \
             TOLLGATE_BLESS=1 cargo test -p tollgate --lib layout"
        );
    }

    #[test]
    fn every_algorithm_is_listed_once() {
        let every = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SubWindows(crate::algorithm::SubWindows { count: 10 }),
            Algorithm::SlidingLog,
            Algorithm::TokenBucket(Default::default()),
            Algorithm::IntervalBucket,
            Algorithm::LeakyBucket(crate::algorithm::LeakyBucket::Meter),
            Algorithm::LeakyBucket(crate::algorithm::LeakyBucket::Shaper),
            Algorithm::Gcra,
            Algorithm::WarmUp(crate::algorithm::WarmUp::new(
                std::time::Duration::from_secs(1),
            )),
            Algorithm::HitCounter,
            Algorithm::Concurrency,
        ];
        for algorithm in &every {
            let i = index(algorithm);
            assert!(i >= 1, "{} is not listed", algorithm.name());
            let listed = &ALGORITHMS[i - 1];
            assert_eq!(listed.name, listed_name(algorithm));
            let parameters = algorithm.module_parameters();
            assert_eq!((listed.of)(parameters).as_ref(), Ok(algorithm));
        }
        assert_eq!(kept(&Algorithm::SlidingLog), Kept::Log);
        assert_eq!(kept(&Algorithm::Gcra), Kept::Words);
    }

    #[test]
    fn a_header_reads_back_what_it_wrote() {
        for settle in [
            None,
            Some(Settle::Report),
            Some(Settle::Credit {
                at: 1_700_000_000_123_456,
            }),
            Some(Settle::Renew),
        ] {
            let header = Header {
                at: Some(1_700_000_000_000_001),
                cost: 7,
                max_delay: None,
                ttl_padding: 60_000,
                settle,
            };
            assert_eq!(Header::decode(&header.encode()), Ok(header));
        }
        let server = Header {
            at: None,
            cost: 0,
            max_delay: Some(5),
            ttl_padding: 0,
            settle: None,
        };
        assert_eq!(Header::decode(&server.encode()), Ok(server));
        assert!(Header::decode(&[0; 40]).is_err());
    }

    #[test]
    fn a_verdict_reads_back_what_it_wrote() {
        let v = Verdict {
            allowed: true,
            limit: 10,
            remaining: 3,
            reset_after: 1_000_000,
            retry_after: 0,
            delay: 250,
        };
        let bytes: Vec<u8> = encode_verdict(&v)
            .into_iter()
            .flat_map(f64::to_le_bytes)
            .collect();
        assert_eq!(bytes.len(), verdict::BYTES);
        assert_eq!(decode_verdict(&bytes), v);
    }
}
