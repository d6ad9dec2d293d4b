//! The Redis scripts decide exactly as the Rust algorithms: the memory store and the Redis
//! store are driven through the same timelines (checks, waits, reports past the limit and
//! give-backs of what was taken earlier, renewals of slots held) and must give identical
//! decisions, for every algorithm, single and multi-tier.

use crate::support;

use std::time::Duration;

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, Decision, Error, Item, LeakyBucket, Limiter, ManualClock, RedisStore, Rule,
    Settle, SubWindows, Tier, TokenBucket, WarmUp,
};

/// xorshift64*: a reproducible stream of arrival sequences.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn rules() -> Vec<Rule> {
    // Each rule its own name: rules of one name and layout share their keys' state.
    let mut made = 0;
    let mut rule = |algorithm: Algorithm, tiers: Vec<Tier>| {
        made += 1;
        let name = format!("diff-{}-{made}", algorithm.name());
        Rule::new(name, algorithm, tiers).unwrap()
    };
    let ms = Duration::from_millis;
    let mut rules = Vec::new();
    let plain = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SubWindows(SubWindows { count: 6 }),
        Algorithm::SlidingLog,
        Algorithm::IntervalBucket,
        Algorithm::HitCounter,
        Algorithm::Concurrency,
    ];
    for algorithm in plain {
        rules.push(rule(algorithm.clone(), vec![Tier::new(5, ms(600))]));
        rules.push(rule(
            algorithm,
            vec![Tier::new(3, ms(300)), Tier::new(7, ms(1_800))],
        ));
    }
    let buckets = [
        Algorithm::TokenBucket(TokenBucket::default()),
        Algorithm::TokenBucket(TokenBucket {
            initial_tokens: Some(1),
        }),
        Algorithm::LeakyBucket(LeakyBucket::Meter),
        Algorithm::LeakyBucket(LeakyBucket::Shaper),
        Algorithm::Gcra,
    ];
    for algorithm in buckets {
        // 3 per 700 ms: an emission interval of 233_333.3 µs, exercising exact fractions.
        rules.push(rule(
            algorithm.clone(),
            vec![Tier::new(3, ms(700)).with_burst(4)],
        ));
        rules.push(rule(
            algorithm,
            vec![Tier::per_second(10).with_burst(4), Tier::new(12, ms(3_000))],
        ));
    }
    // A report into this log takes 1,200 permits: more members than one ZADD sends.
    rules.push(rule(Algorithm::SlidingLog, vec![Tier::new(1_200, ms(900))]));
    let warm_up = Algorithm::WarmUp(WarmUp::new(ms(2_000)));
    rules.push(rule(warm_up.clone(), vec![Tier::per_second(10)]));
    rules.push(rule(
        warm_up,
        vec![Tier::per_second(20), Tier::new(15, ms(2_000))],
    ));
    rules
}

/// Everything a caller can read of a decision, but its source.
fn seen(result: &Result<Decision, Error>) -> String {
    match result {
        Ok(d) => format!(
            "allowed={} limit={} remaining={} reset={:?} retry={:?} delay={:?} tier={}",
            d.allowed(),
            d.limit(),
            d.remaining(),
            d.reset_after(),
            d.retry_after(),
            d.delay(),
            d.tier()
        ),
        Err(Error::Timeout { decision, .. }) => format!("timeout: {}", seen(&Ok(**decision))),
        Err(e) => format!("error: {e}"),
    }
}

#[tokio::test]
async fn memory_and_redis_functions_decide_identically_on_every_timeline() {
    let server = RedisServer::start();
    let store = support::local_store(&server, b"", false).await;
    differential(&[(store, tollgate::Source::Redis)], None).await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_fcall:"), "{stats}");
    assert!(!stats.contains("cmdstat_evalsha:"), "{stats}");
}

/// The same on a server without functions (as before Redis 7): the same code as scripts.
#[tokio::test]
async fn memory_and_redis_scripts_decide_identically_on_every_timeline() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "FUNCTION",
        "",
        "--rename-command",
        "FCALL",
        "",
    ]);
    let store = support::local_store(&server, b"", false).await;
    differential(&[(store, tollgate::Source::Redis)], None).await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}

/// Three ways, on the same timelines: the memory store, the Lua functions and tollgate's
/// Redis module (`crates/tollgate-redis-module`) decide alike, and the functions and the
/// module leave the same keys, with the same values and expiry, in one server (under two
/// key prefixes). The sliding log stays with the functions.
#[tokio::test]
async fn memory_functions_and_the_module_decide_identically_on_every_timeline() {
    let server = RedisServer::start_with(&["--loadmodule", support::redis_module()]);
    let functions = support::local_store(&server, b"f:", false).await;
    let module = support::local_store(&server, b"m:", true).await;
    differential(
        &[
            (functions, tollgate::Source::Redis),
            (module, tollgate::Source::RedisModule),
        ],
        Some(&server),
    )
    .await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_tollgate.check:"), "{stats}");
}

/// Drives the memory store and each of `stores` through the same timelines of every rule of
/// [`rules`]; each store's checks and settlements must be decided by the source given with it
/// (the sliding log by the functions). With `keys_of`, the stores share that
/// server under the prefixes `f:` and `m:`, and after every step the keys of both hold the
/// same values, expiring within 500 ms of each other.
async fn differential(stores: &[(RedisStore, tollgate::Source)], keys_of: Option<&RedisServer>) {
    let mut connection = match keys_of {
        Some(server) => Some(
            redis::Client::open(server.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        ),
        None => None,
    };
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut checks = 0;
    for rule in rules() {
        let memory_clock = ManualClock::new();
        let memory = Limiter::builder(rule.clone())
            .clock(memory_clock.clone())
            .build()
            .unwrap();
        let redis = on_each(stores, &rule, ManualClock::DEFAULT_START_MICROS);
        for step in 0..400 {
            let gap = match random.below(10) {
                0..=2 => 0,
                3..=8 => random.below(250_000),
                _ => random.below(4_000_000),
            };
            memory_clock.advance(Duration::from_micros(gap));
            for (_, clock, _) in &redis {
                clock.advance(Duration::from_micros(gap));
            }
            let key = format!("key-{}", random.below(3));
            let cost = random.below(4).min(rule.capacity());
            let settle = match random.below(10) {
                0 => Some(Settle::Report),
                1 => Some(Settle::Credit {
                    at: memory_clock
                        .now_micros()
                        .saturating_sub(random.below(1_500_000)),
                }),
                2 => Some(Settle::Renew),
                _ => None,
            };
            let op = match settle {
                // A report may take far more than a tier holds: a debt.
                Some(Settle::Report) => Op::Settle(
                    settle.unwrap(),
                    random.below(3) * rule.capacity() + random.below(4),
                ),
                Some(settle) => Op::Settle(settle, random.below(6)),
                None if random.below(8) == 0 => {
                    Op::Acquire(cost, Duration::from_micros(random.below(400_000)))
                }
                None => Op::Check(cost),
            };
            let expected = op.run_now(&memory, &key).await;
            let by_functions = matches!(rule.algorithm(), Algorithm::SlidingLog);
            let at = format!("rule {} {:?}, step {step}", rule.name(), rule.tiers());
            same_on_each(op, &key, &expected, &redis, by_functions, &at).await;
            if let Some(connection) = &mut connection {
                let at = format!("rule {}, step {step}", rule.name());
                support::same_keys(connection, &format!("tg:{}:", rule.name()), &at).await;
            }
            checks += 1;
        }
    }
    assert_eq!(checks, 400 * rules().len());
}

/// A limiter of `rule` on each of `stores`, each on its own clock at `start` (µs), with the
/// source its checks are decided by.
type OnEach = Vec<(
    Limiter<RedisStore, ManualClock>,
    ManualClock,
    tollgate::Source,
)>;

fn on_each(stores: &[(RedisStore, tollgate::Source)], rule: &Rule, start: u64) -> OnEach {
    let limiter = |store: &RedisStore, source: tollgate::Source| {
        let clock = ManualClock::at_micros(start);
        let limiter = Limiter::builder(rule.clone())
            .store(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        (limiter, clock, source)
    };
    stores
        .iter()
        .map(|(s, source)| limiter(s, *source))
        .collect()
}

/// Runs `op` on `key` with each of `redis`: the same as `expected`, decided by the source
/// given with it, or by the functions if `by_functions`.
async fn same_on_each(
    op: Op,
    key: &str,
    expected: &Result<Decision, Error>,
    redis: &[(
        Limiter<RedisStore, ManualClock>,
        ManualClock,
        tollgate::Source,
    )],
    by_functions: bool,
    at: &str,
) {
    for (limiter, _, source) in redis {
        let actual = op.run(limiter, key).await;
        let seen_by = format!("{at}, {key} {op:?}, decided by {source:?}");
        assert_eq!(seen(expected), seen(&actual), "{seen_by}");
        let source = match by_functions {
            true => tollgate::Source::Redis,
            false => *source,
        };
        if let Ok(d) = &actual {
            assert_eq!(d.source(), source, "{seen_by}");
        }
    }
}

/// One step of a timeline.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Acquire(u64, Duration),
    Settle(Settle, u64),
}

impl Op {
    async fn run<S: tollgate::Store>(
        self,
        limiter: &Limiter<S, ManualClock>,
        key: &str,
    ) -> Result<Decision, Error> {
        match self {
            Op::Check(cost) => limiter.check(key, cost).await,
            Op::Acquire(cost, timeout) => limiter.acquire(key, cost, timeout).await,
            Op::Settle(settle, cost) => {
                let item = [Item::new(limiter.rule().name(), key, cost)];
                limiter.settle_batch(&item, settle).await.map(|d| d[0])
            }
        }
    }

    /// On the memory store, a check answers without a future.
    async fn run_now(
        self,
        limiter: &Limiter<tollgate::MemoryStore, ManualClock>,
        key: &str,
    ) -> Result<Decision, Error> {
        match self {
            Op::Check(cost) => limiter.check_now(key, cost),
            _ => self.run(limiter, key).await,
        }
    }
}

/// Calendar periods: days in Paris across the change to summer time (a day of 23 hours), a
/// month in New York across 1 April, weeks from Sunday with an hourly tier: the Redis
/// functions and the module, given each window's boundaries by the caller, decide as the
/// memory store does, and leave the same keys.
#[tokio::test]
async fn calendar_periods_decide_identically_across_days_months_and_a_change_of_time() {
    use tollgate::{Calendar, Weekday};
    let server = RedisServer::start_with(&["--loadmodule", support::redis_module()]);
    let stores = [
        (
            support::local_store(&server, b"f:", false).await,
            tollgate::Source::Redis,
        ),
        (
            support::local_store(&server, b"m:", true).await,
            tollgate::Source::RedisModule,
        ),
    ];
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let paris_day = Calendar::day().in_zone("Europe/Paris").unwrap();
    let new_york_month = Calendar::month().in_zone("America/New_York").unwrap();
    let sunday_week = Calendar::week().week_starts(Weekday::Sunday);
    let rules = [
        Rule::new(
            "cal-day",
            Algorithm::FixedWindow,
            [Tier::calendar(20, paris_day)],
        ),
        Rule::new(
            "cal-month",
            Algorithm::HitCounter,
            [Tier::calendar(60, new_york_month)],
        ),
        Rule::new(
            "cal-week",
            Algorithm::FixedWindow,
            [Tier::calendar(40, sunday_week), Tier::per_hour(8)],
        ),
    ];
    let mut random = Random(0x2545_f491_4f6c_dd1d);
    for rule in rules {
        let rule = rule.unwrap();
        // Saturday 29 March 2025, 20:00 in Paris: the night before the clocks go forward.
        let start = 1_743_274_800_000_000;
        let memory_clock = ManualClock::at_micros(start);
        let memory = Limiter::builder(rule.clone())
            .clock(memory_clock.clone())
            .build()
            .unwrap();
        let redis = on_each(&stores, &rule, start);
        for step in 0..300 {
            // Up to three hours at a time: 300 steps cross about 19 days.
            let gap = Duration::from_micros(random.below(3 * 3_600_000_000));
            memory_clock.advance(gap);
            for (_, clock, _) in &redis {
                clock.advance(gap);
            }
            let key = format!("key-{}", random.below(2));
            let cost = random.below(5);
            let op = match random.below(8) {
                0 => Op::Settle(Settle::Report, cost * 4),
                1 => {
                    let at = memory_clock.now_micros() - random.below(6 * 3_600_000_000);
                    Op::Settle(Settle::Credit { at }, cost)
                }
                _ => Op::Check(cost),
            };
            let expected = op.run_now(&memory, &key).await;
            let at = format!("rule {}, step {step}", rule.name());
            same_on_each(op, &key, &expected, &redis, false, &at).await;
            let at = format!("rule {}, step {step}", rule.name());
            support::same_keys(&mut connection, &format!("tg:{}:", rule.name()), &at).await;
        }
    }
}
