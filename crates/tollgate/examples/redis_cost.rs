//! The load of `benches/redis/cost.py`, which measures what Redis spends per check, by
//! algorithm: `CHECKS` checks from `CALLERS` concurrent callers of one limiter on one
//! connection, keys cycling over 10,000, every check admitted (a permit an hour with a million
//! at once, so that no state expires during a run; warm-up a billion an hour; the concurrency
//! rule's 10 slots a key, leased for a minute, are more than a run takes).
//!
//! `SYSTEM` is an algorithm's name, `two_rules` (a fixed window and a GCRA of the same key,
//! one call of the batch function), or a floor sent the same way with redis-rs: `floor` (a
//! script that reads `TIME`, `GET`s the key and `SET`s it back with `PX`, deciding nothing:
//! what any exact check on the server's clock does at least), `floor_two` (the same for two
//! keys of one slot), `floor_8k` (the floor with an argument of 8,000 bytes, which it writes:
//! as much as a state of 1,000 words) or `one` (`return 1`); or `redis_cell`, the peer that
//! decides inside Redis: redis-cell's `CL.THROTTLE` (GCRA), on a server that loaded its
//! module.
//!
//! An algorithm's name may end in a pattern other than the admitted check of one tier:
//! `:denied` (one permit an hour, keys cycling over 100: after the first checks, every check
//! is denied), `:tiers8` (eight tiers, of a second to a week, every check admitted),
//! `:reported` (a report of one permit of metered work after it ended, in place of each
//! check: never in debt), `:reserved` (a reservation of one permit, committed at one permit:
//! two calls in place of each check) or, for the concurrency rule, `:slots1000` (1,000 slots
//! a key: a state of 1,000 words).
//!
//! Run: `cargo run --release -p tollgate --features redis --example redis_cost -- URL SYSTEM
//! CHECKS [CALLERS]`

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Algorithm, Item, LeakyBucket, Limiter, RedisStore, Rule, Source, SubWindows, Tier, TokenBucket,
    WarmUp,
};

const KEYS: usize = 10_000;

fn rule(name: &str, algorithm: Algorithm) -> Rule {
    rule_of(name, algorithm, Pattern::Admitted)
}

/// What a system's checks meet; see the module's documentation.
#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    Admitted,
    Denied,
    Tiers8,
    Slots1000,
    Reported,
    Reserved,
}

impl Pattern {
    fn of(suffix: Option<&str>) -> Option<Self> {
        Some(match suffix {
            None => Self::Admitted,
            Some("denied") => Self::Denied,
            Some("tiers8") => Self::Tiers8,
            Some("slots1000") => Self::Slots1000,
            Some("reported") => Self::Reported,
            Some("reserved") => Self::Reserved,
            Some(_) => return None,
        })
    }

    /// How many keys the checks cycle over.
    fn keys(self) -> usize {
        if self == Self::Denied { 100 } else { KEYS }
    }
}

fn rule_of(name: &str, algorithm: Algorithm, pattern: Pattern) -> Rule {
    let tier = match (&algorithm, pattern) {
        (_, Pattern::Denied) => Tier::per_hour(1),
        (Algorithm::Concurrency, Pattern::Slots1000) => Tier::new(1_000, Duration::from_secs(60)),
        (Algorithm::Concurrency, _) => Tier::new(10, Duration::from_secs(60)),
        (Algorithm::SlidingLog, _) => Tier::per_hour(100_000),
        // A warm-up admits a key's next permit only once its interval has passed, and its
        // state is as good as new soon after: no tier has both last the run.
        (Algorithm::WarmUp(_), _) => Tier::per_hour(1_000_000_000),
        // A permit an hour with a million at once: every check is admitted and every state
        // outlives the run, as the floor's key does. At a billion an hour, a bucket's state
        // was as good as new microseconds after its check, so its key expired before the
        // next and the row measured Redis expiring and re-creating keys, not the check.
        _ => Tier::new(1_000_000, Duration::from_secs(3_600_000_000)),
    };
    if pattern != Pattern::Tiers8 {
        return Rule::new(name, algorithm, [tier]).expect("a valid rule");
    }
    let tiers = [1, 10, 60, 600, 3_600, 21_600, 86_400, 604_800]
        .map(|seconds| Tier::new(1_000_000_000, Duration::from_secs(seconds)));
    Rule::new(name, algorithm, tiers).expect("a valid rule")
}

fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "fixed_window" => Algorithm::FixedWindow,
        "sliding_window" => Algorithm::SlidingWindow,
        "sub_windows" => Algorithm::SubWindows(SubWindows { count: 10 }),
        "sliding_log" => Algorithm::SlidingLog,
        "token_bucket" => Algorithm::TokenBucket(TokenBucket::default()),
        "interval_bucket" => Algorithm::IntervalBucket,
        "leaky_bucket" => Algorithm::LeakyBucket(LeakyBucket::Meter),
        "gcra" => Algorithm::Gcra,
        "warm_up" => Algorithm::WarmUp(WarmUp::new(Duration::from_secs(60))),
        "hit_counter" => Algorithm::HitCounter,
        "concurrency" => Algorithm::Concurrency,
        _ => return None,
    })
}

/// What one caller sends: its `n`th check.
enum Load {
    /// A limiter; whether it checks two rules; the pattern its checks meet; the path every
    /// decision must come from (a store that failed would have its policy answer instead).
    Limiter(Arc<Limiter<RedisStore>>, bool, Pattern, Source),
    /// A script of `usize` keys, and the length its argument is padded to (with zeros).
    Script(
        redis::aio::MultiplexedConnection,
        Arc<redis::Script>,
        usize,
        usize,
    ),
    /// redis-cell's `CL.THROTTLE`.
    Cell(redis::aio::MultiplexedConnection),
}

impl Load {
    async fn send(&mut self, n: usize) {
        let keys = match self {
            Self::Limiter(_, _, pattern, _) => pattern.keys(),
            _ => KEYS,
        };
        let key = format!("key-{}", n % keys);
        match self {
            Self::Limiter(limiter, false, pattern, source) => {
                let decision = match pattern {
                    Pattern::Reported => limiter.report(&key, 1).await,
                    Pattern::Reserved => {
                        let rule = limiter.rule().name();
                        let reservation = limiter
                            .reserve(&[Item::new(rule, &key, 1)], None)
                            .await
                            .expect("a reservation");
                        let id = reservation.id().expect("every estimate is admitted");
                        limiter.commit(id, 1).await.map(|d| d[0])
                    }
                    _ => limiter.check(&key, 1).await,
                }
                .expect("a decision");
                assert_eq!(decision.source(), *source, "decided by {source:?}");
                if *pattern != Pattern::Denied {
                    assert!(decision.allowed(), "every check is admitted");
                } else if n >= keys {
                    assert!(!decision.allowed(), "every check after the first is denied");
                }
            }
            Self::Limiter(limiter, true, _, source) => {
                let items = [Item::new("fixed", &key, 1), Item::new("gcra", &key, 1)];
                let decisions = limiter.check_batch(&items).await.expect("decisions");
                for decision in decisions.iter() {
                    assert_eq!(decision.source(), *source, "decided by {source:?}");
                }
                assert!(decisions.allowed(), "every check is admitted");
            }
            Self::Cell(connection) => {
                // A key, its burst, a billion an hour, one at a time.
                let throttled: Vec<i64> = redis::cmd("CL.THROTTLE")
                    .arg(&key)
                    .arg(1_000_000_000)
                    .arg(1_000_000_000)
                    .arg(3_600)
                    .arg(1)
                    .query_async(connection)
                    .await
                    .expect("redis-cell's answer");
                assert_eq!(throttled[0], 0, "every check is admitted");
            }
            Self::Script(connection, script, keys, padded) => {
                let mut invocation = script.prepare_invoke();
                for k in 0..*keys {
                    invocation.key(format!("{{{key}}}{k}"));
                }
                let _: i64 = invocation
                    .arg(format!("{n:0>padded$}"))
                    .invoke_async(connection)
                    .await
                    .expect("the script's answer");
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, system, checks, rest @ ..] = &args[..] else {
        eprintln!("usage: redis_cost URL SYSTEM CHECKS [CALLERS]");
        std::process::exit(2);
    };
    let checks: usize = checks.parse().expect("CHECKS: a number");
    let callers: usize = rest
        .first()
        .map_or(16, |c| c.parse().expect("CALLERS: a number"));
    let load = match system.as_str() {
        "redis_cell" => {
            let client = redis::Client::open(url.as_str()).expect("a Redis URL");
            let connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("a connection");
            Load::Cell(connection)
        }
        "floor" | "floor_two" | "floor_8k" | "one" => {
            let code = match system.as_str() {
                "floor" | "floor_8k" => {
                    "local t = redis.call('TIME') local v = redis.call('GET', KEYS[1]) \
                     redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000) return 1"
                }
                "floor_two" => {
                    "local t = redis.call('TIME') local v = redis.call('GET', KEYS[1]) \
                     local u = redis.call('GET', KEYS[2]) \
                     redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000) \
                     redis.call('SET', KEYS[2], ARGV[1], 'PX', 60000) return 1"
                }
                _ => "return 1",
            };
            let client = redis::Client::open(url.as_str()).expect("a Redis URL");
            let connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("a connection");
            let keys = if system == "floor_two" { 2 } else { 1 };
            let padded = if system == "floor_8k" { 8_000 } else { 0 };
            Load::Script(connection, Arc::new(redis::Script::new(code)), keys, padded)
        }
        name => {
            // `module_<algorithm>`: the same checks, through tollgate's Redis module, which the
            // server loads; without the prefix, through the functions.
            let (name, module) = match name.strip_prefix("module_") {
                Some(name) => (name, true),
                None => (name, false),
            };
            let (name, suffix) = match name.split_once(':') {
                Some((name, suffix)) => (name, Some(suffix)),
                None => (name, None),
            };
            let Some(pattern) = Pattern::of(suffix) else {
                eprintln!("unknown pattern {suffix:?}");
                std::process::exit(2);
            };
            let store = RedisStore::builder(url)
                .timeout(Duration::from_secs(10))
                .module(module)
                .build()
                .await
                .expect("a store");
            let builder = match (name, algorithm(name)) {
                ("two_rules", _) => Limiter::builder(rule("fixed", Algorithm::FixedWindow))
                    .rule(rule("gcra", Algorithm::Gcra)),
                (_, Some(algorithm)) => Limiter::builder(rule_of(name, algorithm, pattern)),
                (_, None) => {
                    eprintln!("unknown system {name}");
                    std::process::exit(2);
                }
            };
            let limiter = builder.store(store).build().expect("a limiter");
            let source = if module {
                Source::RedisModule
            } else {
                Source::Redis
            };
            Load::Limiter(Arc::new(limiter), name == "two_rules", pattern, source)
        }
    };
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let mut load = match &load {
                Load::Limiter(limiter, two, pattern, source) => {
                    Load::Limiter(limiter.clone(), *two, *pattern, *source)
                }
                Load::Script(connection, script, keys, padded) => {
                    Load::Script(connection.clone(), script.clone(), *keys, *padded)
                }
                Load::Cell(connection) => Load::Cell(connection.clone()),
            };
            tokio::spawn(async move {
                for n in (caller..checks).step_by(callers) {
                    load.send(n).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a caller");
    }
    println!("{checks}");
}
