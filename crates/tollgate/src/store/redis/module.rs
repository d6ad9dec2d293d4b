//! tollgate's Redis module (`crates/tollgate-redis-module`), on the nodes that load it: the
//! check of one key of a rule whose state is words (every algorithm but the sliding log) is
//! `TOLLGATE.CHECK` rather than `FCALL`, decided inside Redis by the Rust code the memory store
//! runs ([`crate::inside`]), on the same keys, values and expiries. An instance with the
//! module and one without share keys exactly, as the module's writes are the functions'.
//!
//! Each node is found to have the module by using it (see [`check`] for how that stays safe
//! on a node without it). A node that answers that it has no such
//! command, that its module was built from other code, or that the user may not run it, gets
//! `FCALL` (that same check too) for [`ASK_AGAIN`], then is asked again: a node that gains the
//! module (a restart, a failover to a replica that has it) is used within that time, and one
//! that loses it costs one more round trip to the first check that meets it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::RedisError;

use super::wire::{Command, pack_arg};
use crate::inside::OTHER_VERSION;

/// How long a node found without the module is not asked again.
pub(crate) const ASK_AGAIN: Duration = Duration::from_secs(60);

/// Whether a node has the module, as last found. Times are the checks' own (µs since the
/// Unix epoch), so that asking costs no clock read.
#[derive(Debug, Default)]
pub(crate) struct Presence {
    /// Until when the node is taken to lack it; 0 while it has it.
    absent_until: AtomicU64,
}

impl Presence {
    /// Whether to call the module at `now`: it answered last time, or its absence is old news.
    #[inline]
    pub(crate) fn worth_asking(&self, now: u64) -> bool {
        let until = self.absent_until.load(Ordering::Relaxed);
        until == 0 || now >= until
    }

    /// The module answered.
    #[inline]
    pub(crate) fn present(&self) {
        if self.absent_until.load(Ordering::Relaxed) != 0
            && self.absent_until.swap(0, Ordering::Relaxed) != 0
        {
            tracing::info!("redis node has tollgate's module again: checks run inside it");
        }
    }

    /// The node answered `err` at `now`, which [`missing`] says means no module.
    pub(crate) fn absent(&self, now: u64, node: &str, err: &RedisError) {
        let again = u64::try_from(ASK_AGAIN.as_micros()).unwrap_or(u64::MAX);
        let until = now.saturating_add(again).max(1);
        if self.absent_until.swap(until, Ordering::Relaxed) == 0 {
            tracing::info!(
                node, error = %err,
                "redis node without tollgate's module: checks call its functions; asked again in {}s",
                ASK_AGAIN.as_secs()
            );
        }
    }
}

/// `TOLLGATE.CHECK key check rule tiers`: arguments as the functions take them (see
/// [`crate::inside`]), each but the key led by a NUL byte. A server without the module
/// answers that it does not know the command, quoting its first arguments, and a NUL ends the
/// quote of each: the answer is text the client can read. (Quoted whole, a binary argument is
/// rarely UTF-8, and a reply the client cannot parse drops its connection, failing every
/// check in flight on it.)
pub(crate) fn check<'a>(
    key: &'a [u8],
    check: &'a [u8],
    rule: &'a [u8],
    tiers: &'a [u8],
) -> Check<'a> {
    Check {
        key,
        args: [check, rule, tiers],
    }
}

/// A `TOLLGATE.CHECK` call (see [`check`]).
pub(crate) struct Check<'a> {
    key: &'a [u8],
    args: [&'a [u8]; 3],
}

impl Command for Check<'_> {
    fn pack(&self, out: &mut Vec<u8>) {
        // Its count of arguments and its name, which never change, as one copy.
        out.extend_from_slice(b"*5\r\n$14\r\nTOLLGATE.CHECK\r\n");
        pack_arg(out, &[self.key]);
        for arg in self.args {
            pack_arg(out, &[b"\0", arg]);
        }
    }

    fn into_cmd(self) -> redis::Cmd {
        let data = self.key.len() + self.args.iter().map(|a| a.len() + 1).sum::<usize>() + 16;
        let mut call = redis::Cmd::with_capacity(5, data);
        call.arg("TOLLGATE.CHECK").arg(self.key);
        for arg in self.args {
            led(&mut call, arg);
        }
        call
    }
}

/// Whether the module may be asked about `key`: a server without it quotes the key in its
/// answer (up to a NUL byte, and cut at 128 bytes), which must stay UTF-8 (see [`check`]).
/// A key is any bytes: one whose quote may not be UTF-8 goes to the functions.
#[inline]
pub(crate) fn quotable(key: &[u8]) -> bool {
    quotable_all(&[key])
}

/// `command numkeys key... check items rule tiers [rule tiers ...]` (`TOLLGATE.BATCH`,
/// `TOLLGATE.SETTLE`): the batch or settle function's keys and arguments (`args`: the check,
/// the items, then each item's tiers), with each item's rule argument before its tiers, each
/// argument after the keys led by a NUL byte (see [`check`]).
pub(crate) fn items(
    command: &str,
    keys: &[Vec<u8>],
    args: &[&[u8]],
    rules: &[Vec<u8>],
) -> redis::Cmd {
    let data: usize = keys.iter().map(Vec::len).sum::<usize>()
        + args.iter().map(|a| a.len() + 1).sum::<usize>()
        + rules.iter().map(|r| r.len() + 1).sum::<usize>()
        + 24;
    let mut call = redis::Cmd::with_capacity(2 + keys.len() + args.len() + rules.len(), data);
    call.arg(command).arg(keys.len()).arg(keys);
    let (check, items, tiers) = (args[0], args[1], &args[2..]);
    let rules_and_tiers = rules
        .iter()
        .zip(tiers)
        .flat_map(|(rule, tiers)| [rule.as_slice(), tiers]);
    for arg in [check, items].into_iter().chain(rules_and_tiers) {
        led(&mut call, arg);
    }
    call
}

/// Whether the module may be asked about `keys` (see [`quotable`]): a server without it
/// quotes them together, cut at 128 bytes (a count before them, and quotes and a space around
/// each).
pub(crate) fn quotable_all<K: AsRef<[u8]>>(keys: &[K]) -> bool {
    fn shown<K: AsRef<[u8]>>(key: &K) -> &[u8] {
        let key = key.as_ref();
        key.split(|&b| b == 0).next().unwrap_or(key)
    }
    // A NUL is ASCII: an ASCII key's quote is too, found without looking for the NUL.
    keys.iter().all(|k| k.as_ref().is_ascii())
        || keys.iter().all(|k| shown(k).is_ascii())
        || (keys.iter().map(|k| shown(k).len() + 3).sum::<usize>() < 100
            && keys.iter().all(|k| std::str::from_utf8(shown(k)).is_ok()))
}

/// Adds `arg` to `call`, led by a NUL byte.
fn led(call: &mut redis::Cmd, arg: &[u8]) {
    use redis::RedisWrite as _;
    use std::io::Write as _;
    let mut writer = call.writer_for_next_arg();
    // Writing to a command's buffer cannot fail.
    let _ = writer.write_all(&[0]);
    let _ = writer.write_all(arg);
}

/// Whether `err` says the node cannot run the module's check: no such command, a module of
/// other code (see [`crate::inside::CONTRACT`]), or a user not allowed it.
pub(crate) fn missing(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        Some("ERR") => err.detail().is_some_and(|d| {
            d.contains(OTHER_VERSION) || d.to_ascii_lowercase().contains("unknown command")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::inside::{Check, Item, OTHER_VERSION, Prepared, Refused, rule_args};
    use crate::layout::packed;
    use crate::store::redis::args::tier_args;
    use crate::{Algorithm, LeakyBucket, Rule, SubWindows, Tier, TokenBucket, WarmUp};

    fn rules() -> Vec<Rule> {
        let hour = Duration::from_secs(3_600);
        let algorithms = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SubWindows(SubWindows { count: 4 }),
            Algorithm::TokenBucket(TokenBucket {
                initial_tokens: Some(2),
            }),
            Algorithm::IntervalBucket,
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            Algorithm::Gcra,
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(60))),
            Algorithm::HitCounter,
            Algorithm::Concurrency,
        ];
        algorithms
            .into_iter()
            .map(|a| Rule::new("r", a, [Tier::new(700, hour), Tier::per_second(3)]).unwrap())
            .collect()
    }

    /// The arguments a store sends make a rule the module decides: the contract both ends
    /// keep, every algorithm but the sliding log.
    #[test]
    fn a_stores_arguments_make_the_rule_it_sent() {
        for rule in rules() {
            let prepared = Prepared::new(&rule_args(rule.algorithm()), &tier_args(&rule)).unwrap();
            assert_eq!(prepared.rule().algorithm(), rule.algorithm());
            assert_eq!(prepared.rule().tiers(), rule.tiers());
        }
        let log = Rule::new("log", Algorithm::SlidingLog, [Tier::per_second(3)]).unwrap();
        let refused = Prepared::new(&rule_args(log.algorithm()), &tier_args(&log));
        assert!(refused.is_err());
    }

    /// A module built from other Lua code refuses a store's call, saying so in the words the
    /// store looks for to call the functions instead.
    #[test]
    fn a_module_of_other_code_refuses_the_call() {
        let rule = &rules()[0];
        let mut args = rule_args(rule.algorithm());
        args[0] ^= 1;
        let refused = Prepared::new(&args, &tier_args(rule)).unwrap_err();
        assert_eq!(refused, Refused(OTHER_VERSION));
    }

    /// A check on the server's time whose clock reads 0 is refused (an error the store
    /// reports), never decided at the epoch, where every window would be new.
    #[test]
    fn a_clock_that_reads_nothing_refuses_the_check() {
        let rule = &rules()[0];
        let prepared = Prepared::new(&rule_args(rule.algorithm()), &tier_args(rule)).unwrap();
        let server_time = [-1.0f64, 1.0, -1.0, 0.0, 0.0, 0.0];
        let check: Vec<u8> = server_time.iter().flat_map(|d| d.to_le_bytes()).collect();
        assert!(prepared.check(&check, None, || 0).is_err());
        assert!(
            prepared
                .check(&check, None, || 1_700_000_000_000_000)
                .is_ok()
        );
    }

    proptest! {
        /// Inside Redis a panic would take the server down: arguments of any bytes are
        /// refused or decided, never a panic.
        #[test]
        fn arguments_of_any_bytes_are_refused_or_decided(
            rule in proptest::collection::vec(any::<u8>(), 0..40),
            tiers in proptest::collection::vec(any::<u8>(), 0..200),
            check in proptest::collection::vec(any::<u8>(), 0..60),
            stored in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            which in 0usize..10,
        ) {
            let _ = Prepared::new(&rule, &tiers);
            let rules = rules();
            let valid = &rules[which];
            let prepared =
                Prepared::new(&rule_args(valid.algorithm()), &tier_args(valid)).unwrap();
            let _ = prepared.check(&check, stored.as_deref(), || 1_700_000_000_000_000);
        }

        /// Arguments a store would send, and a state the module would write, with doubles
        /// replaced by hostile ones (NaN, infinities, halves, 2^53 and beyond, negatives):
        /// refused or decided (checks, batches and settlements), never a panic, here where
        /// arithmetic overflow panics too.
        #[test]
        fn a_stores_arguments_with_hostile_doubles_are_refused_or_decided(
            which in 0usize..10,
            swaps in proptest::collection::vec((0usize..4, any::<prop::sample::Index>(), 0usize..HOSTILE.len()), 1..6),
            attempt in proptest::array::uniform6(0usize..HOSTILE.len()),
            description in proptest::array::uniform5(0usize..HOSTILE.len()),
        ) {
            let rules = rules();
            let valid = &rules[which];
            let mut args = [
                rule_args(valid.algorithm()),
                tier_args(valid),
                Vec::new(),
                vec![0; 8 * valid.words()],
            ];
            let prepared = Prepared::new(&args[0], &args[1]).unwrap();
            // A state the module wrote: one admitted check an hour ago.
            let check = packed([1_700_000_000_000_000.0 - 3.6e9, 1.0, -1.0, 0.0, 0.0, 0.0]);
            if let Ok(outcome) = prepared.check(&check, None, || 0)
                && let crate::inside::Write::Set { value, .. } = outcome.write
            {
                args[3] = value;
            }
            args[2] = packed(attempt.map(|i| HOSTILE[i]));
            for (arg, at, value) in swaps {
                let words = args[arg].len() / 8;
                if words > 1 {
                    // The rule's contract (its first word) stays: another is refused first.
                    let at = if arg == 0 { 1 + at.index(words - 1) } else { at.index(words) };
                    args[arg][8 * at..8 * at + 8].copy_from_slice(&HOSTILE[value].to_le_bytes());
                }
            }
            let now = || 1_700_000_000_000_000;
            let Ok(prepared) = Prepared::new(&args[0], &args[1]) else {
                return Ok(());
            };
            let _ = prepared.check(&args[2], Some(&args[3]), now);
            let _ = prepared.check(&args[2], None, now);
            let Ok(check) = Check::new(&args[2], now) else {
                return Ok(());
            };
            let described = packed(description.map(|i| HOSTILE[i]));
            if let Ok((_, items)) = crate::inside::described(&described) {
                let items: Vec<Item<'_>> = items
                    .iter()
                    .map(|&(cost, shadow)| Item { prepared: &prepared, cost, shadow, stored: Some(&args[3]) })
                    .collect();
                let _ = crate::inside::decide(&check, &items, true);
                let _ = crate::inside::settle(&check, &items);
            }
        }
    }

    /// Doubles a hostile caller sends, and a few a store does.
    const HOSTILE: [f64; 20] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        3.0,
        1e6,
        3.6e9,
        1_700_000_000_000_000.0,
        9_007_199_254_740_991.0,
        9_007_199_254_740_992.0,
        1.8446744073709552e19,
        1e300,
        -1e300,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
        4_294_967_295.0,
    ];
}
