//! tollgate's Redis module (`crates/tollgate-redis-module`), on the nodes that load it: the
//! check of one key of a rule whose state is words (every algorithm but the sliding log) is
//! `TOLLGATE.CHECK` rather than `FCALL`, decided inside Redis by the Rust code the memory store
//! runs ([`crate::inside`]), on the same keys, values and expiries. An instance with the
//! module and one without share keys exactly, as the module's writes are the functions'.
//!
//! Each node is found to have the module by using it (see [`check`] for how that stays safe
//! on a node without it). A node that answers that it has no such
//! command, that its module is of another version, or that the user may not run it, gets
//! `FCALL` (that same check too) for [`ASK_AGAIN`], then is asked again: a node that gains the
//! module (a restart, a failover to a replica that has it) is used within that time, and one
//! that loses it costs one more round trip to the first check that meets it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::RedisError;

use crate::inside::OTHER_VERSION;

/// How long a node found without the module is not asked again.
pub(crate) const ASK_AGAIN: Duration = Duration::from_secs(60);

/// Whether a node has the module, as last found.
#[derive(Debug)]
pub(crate) struct Presence {
    since: Instant,
    /// Until when (ms after `since`) the node is taken to lack it; 0 while it has it.
    absent_until: AtomicU64,
}

impl Default for Presence {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            absent_until: AtomicU64::new(0),
        }
    }
}

impl Presence {
    /// Whether to call the module: it answered last time, or its absence is old news.
    #[inline]
    pub(crate) fn worth_asking(&self) -> bool {
        let until = self.absent_until.load(Ordering::Relaxed);
        until == 0 || self.elapsed_ms() >= until
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

    /// The node answered `err`, which [`missing`] says means no module.
    pub(crate) fn absent(&self, node: &str, err: &RedisError) {
        let until = (self.elapsed_ms() + ASK_AGAIN.as_millis() as u64).max(1);
        if self.absent_until.swap(until, Ordering::Relaxed) == 0 {
            tracing::info!(
                node, error = %err,
                "redis node without tollgate's module: checks call its functions; asked again in {}s",
                ASK_AGAIN.as_secs()
            );
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// `TOLLGATE.CHECK key check rule tiers`: arguments as the functions take them (see
/// [`crate::inside`]), each but the key led by a NUL byte. A server without the module
/// answers that it does not know the command, quoting its first arguments, and a NUL ends the
/// quote of each: the answer is text the client can read. (Quoted whole, a binary argument is
/// rarely UTF-8, and a reply the client cannot parse drops its connection, failing every
/// check in flight on it.)
pub(crate) fn check(key: &[u8], check: &[u8], rule: &[u8], tiers: &[u8]) -> redis::Cmd {
    use redis::RedisWrite as _;
    use std::io::Write as _;
    let data = key.len() + check.len() + rule.len() + tiers.len() + 16;
    let mut call = redis::Cmd::with_capacity(5, data);
    call.arg("TOLLGATE.CHECK").arg(key);
    for arg in [check, rule, tiers] {
        let mut writer = call.writer_for_next_arg();
        // Writing to a command's buffer cannot fail.
        let _ = writer.write_all(&[0]);
        let _ = writer.write_all(arg);
    }
    call
}

/// Whether the module may be asked about `key`: a server without it quotes the key, cut at
/// 128 bytes, in its answer, which must stay UTF-8 (see [`check`]). Keys are UTF-8; a long
/// one of other than ASCII may be cut inside a character, and goes to the functions.
#[inline]
pub(crate) fn quotable(key: &[u8]) -> bool {
    key.len() < 128 || key.is_ascii()
}

/// Whether `err` says the node cannot run the module's check: no such command, a module of
/// another version, or a user not allowed it.
pub(crate) fn missing(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        Some("ERR") => err.detail().is_some_and(|d| {
            d.contains(OTHER_VERSION) || d.to_ascii_lowercase().contains("unknown command")
        }),
        _ => false,
    }
}
