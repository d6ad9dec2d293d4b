//! The Lua code: a shared prelude, two drivers and one file per algorithm (the KEYS/ARGV
//! contract heads `lua/prelude.lua`). A check calls its algorithm's function in one library
//! (`FCALL`, Redis 7 and later); on servers without functions, one script per algorithm
//! (`EVALSHA`) built from the same files. Either way a check is decided, every tier at once,
//! atomically in one round trip.
//!
//! Why functions: a library is compiled once per server, so its helpers and the tiers it has
//! parsed are kept between calls, where a script re-creates every helper on each call. That is
//! half of what Redis spends on a check.
//!
//! Why server-side code at all: it runs alone, so keys cannot expire or change between its
//! reads and its writes, as they can between `MULTI` and `EXEC`, and no lock is ever held
//! across the network.

use std::sync::LazyLock;

use redis::Script;

use crate::algorithm::Algorithm;
use crate::layout::{self, ALGORITHMS, Kept};

/// The layout's names (`lua/layout.lua`, written from `layout.rs`), then the prelude.
const PRELUDE: &str = concat!(
    include_str!("lua/layout.lua"),
    include_str!("lua/prelude.lua")
);
/// Both drivers, as the batch needs them: words, then the log.
const DRIVERS: [&str; 2] = [include_str!("lua/words.lua"), include_str!("lua/log.lua")];
const BATCH: &str = include_str!("lua/batch.lua");
const COUNTERS: &str = include_str!("lua/counters.lua");
const REGIONS: &str = include_str!("lua/regions.lua");
const RESERVATIONS: &str = include_str!("lua/reservations.lua");
const METERED: &str = include_str!("lua/metered.lua");

/// What an algorithm's file may leave out: whether its expired states are read as new (see
/// `Decide::forgets`), whether it holds slots and how it renews them (`Decide::holds_slots`,
/// `Decide::renew`).
const DEFAULTS: &str = "local forgets = false\nlocal slots = false\nlocal renew = nil\n";

/// The Lua driver of each way an algorithm keeps its state.
fn driver_code(kept: Kept) -> &'static str {
    match kept {
        Kept::Words => DRIVERS[0],
        Kept::Log => DRIVERS[1],
    }
}

/// The Lua function (of the keys and the arguments) that decides a check with the algorithm
/// defined just before it.
fn entry_of(kept: Kept) -> &'static str {
    match kept {
        Kept::Words => "words_of(decide, denied, expires_at, forgets)",
        Kept::Log => "log_of(decide)",
    }
}

/// The Lua call that registers the algorithm defined just before it for batches.
fn registration(kept: Kept) -> &'static str {
    match kept {
        Kept::Words => {
            "{decide = decide, denied = denied, expires_at = expires_at, \
             forgets = forgets, debit = debit, credit = credit, renew = renew, slots = slots}"
        }
        Kept::Log => "{decide = decide, debit = debit, credit = credit, log = true}",
    }
}

/// Every algorithm's block, registered for batches under its index (from 1, in the order of
/// [`ALGORITHMS`]); with `functions`, each also registered as its library's function.
fn algorithm_blocks(functions: bool) -> String {
    let mut body = String::new();
    for (i, listed) in ALGORITHMS.iter().enumerate() {
        let (name, code, kept) = (listed.name, listed.lua, listed.kept);
        let function = if functions {
            format!(
                "redis.register_function('__LIBRARY___{name}', {})\n",
                entry_of(kept)
            )
        } else {
            String::new()
        };
        body.push_str(&format!(
            "\ndo\n{DEFAULTS}{code}\nalgorithms[{}] = {}\n{function}end\n",
            i + 1,
            registration(kept)
        ));
    }
    body
}

/// The library of every algorithm's function and the batch function, named after a hash of
/// its code so that different versions of tollgate can share a server.
pub(crate) struct Library {
    /// `tollgate_<hash>`; each function is `<name>_<algorithm>`, and `<name>_batch`,
    /// `<name>_settle`, `<name>_add`, `<name>_lease`, `<name>_claim`, and the reservations'
    /// `<name>_keep`, `<name>_take`, `<name>_expired`, `<name>_reserve` and `<name>_commit`, and
    /// the global rules' `<name>_regional_check`, `<name>_regional_sync` and
    /// `<name>_regional_merge`.
    pub(crate) name: String,
    /// The source given to `FUNCTION LOAD REPLACE`.
    pub(crate) code: String,
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let mut body = format!("{PRELUDE}{}{}", DRIVERS[0], DRIVERS[1]);
    body.push_str(&algorithm_blocks(true));
    body.push_str(BATCH);
    body.push_str(COUNTERS);
    body.push_str(REGIONS);
    body.push_str(RESERVATIONS);
    body.push_str(METERED);
    for function in [
        "batch",
        "settle",
        "add",
        "lease",
        "claim",
        "keep",
        "take",
        "expired",
        "reserve",
        "commit",
        "regional_check",
        "regional_sync",
        "regional_merge",
    ] {
        body.push_str(&format!(
            "\nredis.register_function('__LIBRARY___{function}', {function})\n"
        ));
    }
    let hash = Script::new(&body).get_hash()[..12].to_string();
    let name = format!("tollgate_{hash}");
    let code = format!("#!lua name={name}\n{}", body.replace("__LIBRARY__", &name));
    Library { name, code }
});

/// How a call is sent: a function of [`LIBRARY`], or the same code as one script.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Its function in [`LIBRARY`].
    pub(crate) function: String,
    /// The same code as one script, for servers without functions.
    pub(crate) script: Script,
    /// Whether it keeps one key per tier (else one per rule).
    pub(crate) key_per_tier: bool,
}

static ENTRIES: LazyLock<Vec<Entry>> = LazyLock::new(|| {
    ALGORITHMS
        .iter()
        .map(|listed| {
            let script = format!(
                "{PRELUDE}{}{DEFAULTS}{}\nreturn ({})(KEYS, ARGV)\n",
                driver_code(listed.kept),
                listed.lua,
                entry_of(listed.kept)
            );
            Entry {
                function: format!("{}_{}", LIBRARY.name, listed.name),
                script: Script::new(&script),
                key_per_tier: listed.kept == Kept::Log,
            }
        })
        .collect()
});

/// Batches: items of any algorithms, all-or-nothing in one call (`lua/batch.lua`).
pub(crate) static BATCH_ENTRY: LazyLock<Entry> = LazyLock::new(|| {
    let script = format!(
        "{PRELUDE}{}{}{}{BATCH}\nreturn batch(KEYS, ARGV)\n",
        DRIVERS[0],
        DRIVERS[1],
        algorithm_blocks(false)
    );
    Entry {
        function: format!("{}_batch", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
});

/// Settlements: reports and credits of items of any algorithms in one call (`lua/batch.lua`).
pub(crate) static SETTLE_ENTRY: LazyLock<Entry> = LazyLock::new(|| {
    let script = format!(
        "{PRELUDE}{}{}{}{BATCH}\nreturn settle(KEYS, ARGV)\n",
        DRIVERS[0],
        DRIVERS[1],
        algorithm_blocks(false)
    );
    Entry {
        function: format!("{}_settle", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
});

/// A reservation made with its record in one call (`lua/metered.lua`).
pub(crate) static RESERVE_ENTRY: LazyLock<Entry> = LazyLock::new(|| metered("reserve"));

/// A reservation committed (or cancelled, at 0) with its record taken, in one call.
pub(crate) static COMMIT_ENTRY: LazyLock<Entry> = LazyLock::new(|| metered("commit"));

fn metered(function: &str) -> Entry {
    let script = format!(
        "{PRELUDE}{}{}{}{BATCH}{METERED}\nreturn {function}(KEYS, ARGV)\n",
        DRIVERS[0],
        DRIVERS[1],
        algorithm_blocks(false)
    );
    Entry {
        function: format!("{}_{function}", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
}

/// Counters of the hybrid and lease stores (`lua/counters.lua`): adding to them.
pub(crate) static ADD_ENTRY: LazyLock<Entry> = LazyLock::new(|| counters("add"));

/// Counters of the hybrid store (`lua/counters.lua`): pushing to them and claiming from them.
pub(crate) static CLAIM_ENTRY: LazyLock<Entry> = LazyLock::new(|| counters("claim"));

/// Counters of the hybrid and lease stores (`lua/counters.lua`): leasing from them.
pub(crate) static LEASE_ENTRY: LazyLock<Entry> = LazyLock::new(|| counters("lease"));

fn counters(function: &str) -> Entry {
    let script = format!("{PRELUDE}{COUNTERS}\nreturn {function}(KEYS, ARGV)\n");
    Entry {
        function: format!("{}_{function}", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
}

/// Global rules' counts (`lua/regions.lua`): a check in this region.
pub(crate) static REGIONAL_CHECK_ENTRY: LazyLock<Entry> =
    LazyLock::new(|| regional("regional_check"));

/// Global rules' counts: this region's side of a replication round.
pub(crate) static REGIONAL_SYNC_ENTRY: LazyLock<Entry> =
    LazyLock::new(|| regional("regional_sync"));

/// Global rules' counts: a peer's side of a replication round.
pub(crate) static REGIONAL_MERGE_ENTRY: LazyLock<Entry> =
    LazyLock::new(|| regional("regional_merge"));

fn regional(function: &str) -> Entry {
    let script = format!("{PRELUDE}{REGIONS}\nreturn {function}(KEYS, ARGV)\n");
    Entry {
        function: format!("{}_{function}", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
}

/// Reservations' records (`lua/reservations.lua`): keeping one.
pub(crate) static KEEP_ENTRY: LazyLock<Entry> = LazyLock::new(|| reservations("keep"));

/// Reservations' records: taking one out.
pub(crate) static TAKE_ENTRY: LazyLock<Entry> = LazyLock::new(|| reservations("take"));

/// Reservations' records: taking out the expired ones.
pub(crate) static EXPIRED_ENTRY: LazyLock<Entry> = LazyLock::new(|| reservations("expired"));

fn reservations(function: &str) -> Entry {
    let script = format!("{PRELUDE}{RESERVATIONS}\nreturn {function}(KEYS, ARGV)\n");
    Entry {
        function: format!("{}_{function}", LIBRARY.name),
        script: Script::new(&script),
        key_per_tier: false,
    }
}

/// How checks of `algorithm` alone are sent.
pub(crate) fn entry(algorithm: &Algorithm) -> &'static Entry {
    &ENTRIES[layout::index(algorithm) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_its_entry() {
        let gcra = entry(&Algorithm::Gcra);
        assert_eq!(gcra.function, format!("{}_gcra", LIBRARY.name));
        assert!(entry(&Algorithm::SlidingLog).key_per_tier);
        assert!(!gcra.key_per_tier);
        for (i, listed) in ALGORITHMS.iter().enumerate() {
            let registered = format!("redis.register_function('{}_{}'", LIBRARY.name, listed.name);
            assert!(LIBRARY.code.contains(&registered), "{}", listed.name);
            assert!(LIBRARY.code.contains(&format!("algorithms[{}] =", i + 1)));
        }
        assert!(LIBRARY.code.contains(&format!("'{}_batch'", LIBRARY.name)));
        assert!(BATCH_ENTRY.script.get_hash() != gcra.script.get_hash());
    }
}
