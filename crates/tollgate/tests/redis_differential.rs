//! The Redis scripts decide exactly as the Rust algorithms: the memory store and the Redis
//! store are driven through the same timelines (checks, waits, reports past the limit and
//! give-backs of what was taken earlier, renewals of slots held) and must give identical
//! decisions, for every algorithm, single and multi-tier.

mod support;

use std::time::Duration;

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, Decision, Error, Item, LeakyBucket, Limiter, ManualClock, RedisStore, Rule,
    Settle, StoreTime, SubWindows, Tier, TokenBucket, WarmUp,
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
        Err(Error::Timeout { decision, .. }) => format!("timeout: {}", seen(&Ok(*decision))),
        Err(e) => format!("error: {e}"),
    }
}

#[tokio::test]
async fn memory_and_redis_functions_decide_identically_on_every_timeline() {
    let server = RedisServer::start();
    differential(&server).await;
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
    differential(&server).await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}

async fn differential(server: &RedisServer) {
    let store = RedisStore::builder(&server.url())
        .store_time(StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut checks = 0;
    for rule in rules() {
        let (memory_clock, redis_clock) = (ManualClock::new(), ManualClock::new());
        let memory = Limiter::builder(rule.clone())
            .clock(memory_clock.clone())
            .build()
            .unwrap();
        let redis = Limiter::builder(rule.clone())
            .store(store.clone())
            .clock(redis_clock.clone())
            .build()
            .unwrap();
        for step in 0..400 {
            let gap = match random.below(10) {
                0..=2 => 0,
                3..=8 => random.below(250_000),
                _ => random.below(4_000_000),
            };
            memory_clock.advance(Duration::from_micros(gap));
            redis_clock.advance(Duration::from_micros(gap));
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
            let (expected, actual) = if let Some(settle) = settle {
                // A report may take far more than a tier holds: a debt.
                let cost = match settle {
                    Settle::Report => random.below(3) * rule.capacity() + random.below(4),
                    Settle::Credit { .. } | Settle::Renew => random.below(6),
                };
                let item = [Item::new(rule.name(), &key, cost)];
                let binding = |d: Result<tollgate::Decisions, Error>| d.map(|d| d[0]);
                (
                    binding(memory.settle_batch(&item, settle).await),
                    binding(redis.settle_batch(&item, settle).await),
                )
            } else if random.below(8) == 0 {
                let timeout = Duration::from_micros(random.below(400_000));
                (
                    memory.acquire(&key, cost, timeout).await,
                    redis.acquire(&key, cost, timeout).await,
                )
            } else {
                (memory.check_now(&key, cost), redis.check(&key, cost).await)
            };
            assert_eq!(
                seen(&expected),
                seen(&actual),
                "rule {} {:?}, step {step}, {key} cost {cost}",
                rule.name(),
                rule.tiers()
            );
            if let Ok(d) = &actual {
                assert_eq!(d.source(), tollgate::Source::Redis);
            }
            assert_eq!(memory_clock.now_micros(), redis_clock.now_micros());
            checks += 1;
        }
    }
    assert_eq!(checks, 400 * rules().len());
}

/// Calendar periods: days in Paris across the change to summer time (a day of 23 hours), a
/// month in New York across 1 April, weeks from Sunday with an hourly tier: the Redis
/// functions, given each window's boundaries by the caller, decide as the memory store does.
#[tokio::test]
async fn calendar_periods_decide_identically_across_days_months_and_a_change_of_time() {
    use tollgate::{Calendar, Weekday};
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .store_time(StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .build()
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
        let (memory_clock, redis_clock) =
            (ManualClock::at_micros(start), ManualClock::at_micros(start));
        let memory = Limiter::builder(rule.clone())
            .clock(memory_clock.clone())
            .build()
            .unwrap();
        let redis = Limiter::builder(rule.clone())
            .store(store.clone())
            .clock(redis_clock.clone())
            .build()
            .unwrap();
        for step in 0..300 {
            // Up to three hours at a time: 300 steps cross about 19 days.
            let gap = Duration::from_micros(random.below(3 * 3_600_000_000));
            memory_clock.advance(gap);
            redis_clock.advance(gap);
            let key = format!("key-{}", random.below(2));
            let cost = random.below(5);
            let (expected, actual) = match random.below(8) {
                0 => {
                    let item = [Item::new(rule.name(), &key, cost * 4)];
                    let binding = |d: Result<tollgate::Decisions, Error>| d.map(|d| d[0]);
                    (
                        binding(memory.settle_batch(&item, Settle::Report).await),
                        binding(redis.settle_batch(&item, Settle::Report).await),
                    )
                }
                1 => {
                    let at = memory_clock.now_micros() - random.below(6 * 3_600_000_000);
                    let item = [Item::new(rule.name(), &key, cost)];
                    let binding = |d: Result<tollgate::Decisions, Error>| d.map(|d| d[0]);
                    (
                        binding(memory.settle_batch(&item, Settle::Credit { at }).await),
                        binding(redis.settle_batch(&item, Settle::Credit { at }).await),
                    )
                }
                _ => (memory.check_now(&key, cost), redis.check(&key, cost).await),
            };
            assert_eq!(
                seen(&expected),
                seen(&actual),
                "rule {}, step {step}, {key} cost {cost}",
                rule.name()
            );
        }
    }
}
