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

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// How an algorithm keeps its state, and so which driver runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// A few words per tier in one string key.
    Words,
    /// One sorted set per tier.
    Log,
}

impl Driver {
    fn code(self) -> &'static str {
        match self {
            Self::Words => include_str!("lua/words.lua"),
            Self::Log => include_str!("lua/log.lua"),
        }
    }

    /// The Lua call that decides a check with the algorithm defined just before it.
    fn entry(self, keys: &str, args: &str) -> String {
        match self {
            Self::Words => {
                format!("words({keys}, {args}, decide, first_seen, expires_at, windowed)")
            }
            Self::Log => format!("log({keys}, {args}, decide)"),
        }
    }
}

/// Every algorithm's name (as in its function's name), its code and its driver.
const ALGORITHMS: [(&str, &str, Driver); 9] = [
    (
        "fixed_window",
        include_str!("lua/fixed_window.lua"),
        Driver::Words,
    ),
    (
        "sliding_window",
        include_str!("lua/sliding_window.lua"),
        Driver::Words,
    ),
    (
        "sub_windows",
        include_str!("lua/sub_windows.lua"),
        Driver::Words,
    ),
    (
        "sliding_log",
        include_str!("lua/sliding_log.lua"),
        Driver::Log,
    ),
    (
        "token_bucket",
        include_str!("lua/token_bucket.lua"),
        Driver::Words,
    ),
    (
        "interval_bucket",
        include_str!("lua/interval_bucket.lua"),
        Driver::Words,
    ),
    (
        "leaky_bucket",
        include_str!("lua/leaky_bucket.lua"),
        Driver::Words,
    ),
    ("gcra", include_str!("lua/gcra.lua"), Driver::Words),
    ("warm_up", include_str!("lua/warm_up.lua"), Driver::Words),
];

/// The library of every algorithm's function, named after a hash of its code so that
/// different versions of tollgate can share a server.
pub(crate) struct Library {
    /// `tollgate_<hash>`; each function is `<name>_<algorithm>`.
    pub(crate) name: String,
    /// The source given to `FUNCTION LOAD REPLACE`.
    pub(crate) code: String,
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let mut body = String::from(PRELUDE);
    body.push_str(Driver::Words.code());
    body.push_str(Driver::Log.code());
    for (algorithm, code, driver) in ALGORITHMS {
        let call = driver.entry("keys", "args");
        body.push_str(&format!(
            "\ndo\n{code}\nredis.register_function('__LIBRARY___{algorithm}', \
             function(keys, args) return {call} end)\nend\n"
        ));
    }
    let hash = Script::new(&body).get_hash()[..12].to_string();
    let name = format!("tollgate_{hash}");
    let code = format!("#!lua name={name}\n{}", body.replace("__LIBRARY__", &name));
    Library { name, code }
});

/// How a check of one algorithm is sent.
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
        .map(|&(algorithm, code, driver)| {
            let call = driver.entry("KEYS", "ARGV");
            let script = format!("{PRELUDE}{}{code}\nreturn {call}\n", driver.code());
            Entry {
                function: format!("{}_{algorithm}", LIBRARY.name),
                script: Script::new(&script),
                key_per_tier: driver == Driver::Log,
            }
        })
        .collect()
});

/// How checks of `algorithm` are sent.
pub(crate) fn entry(algorithm: &Algorithm) -> &'static Entry {
    let index = match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::SubWindows(_) => 2,
        Algorithm::SlidingLog => 3,
        Algorithm::TokenBucket(_) => 4,
        Algorithm::IntervalBucket => 5,
        Algorithm::LeakyBucket(_) => 6,
        Algorithm::Gcra => 7,
        Algorithm::WarmUp(_) => 8,
    };
    &ENTRIES[index]
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
        for (algorithm, _, _) in ALGORITHMS {
            let registered = format!("redis.register_function('{}_{algorithm}'", LIBRARY.name);
            assert!(LIBRARY.code.contains(&registered), "{algorithm}");
        }
    }
}
