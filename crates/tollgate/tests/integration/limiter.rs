//! The Limiter API as a Rust service uses it: checks, waits, and every kind of bad input.

use std::time::Duration;

use tollgate::{
    Algorithm, Clock, Error, LeakyBucket, Limiter, MAX_KEY_LEN, ManualClock, MemoryStore, Rule,
    SystemClock, Tier, TokenBucket, WarmUp,
};

fn manual(
    algorithm: Algorithm,
    tiers: impl IntoIterator<Item = Tier>,
) -> Limiter<MemoryStore, ManualClock> {
    let rule = Rule::new("api", algorithm, tiers).unwrap();
    Limiter::builder(rule)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[test]
fn limiters_are_shareable_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Limiter>();
    shareable::<Limiter<MemoryStore, ManualClock>>();
}

#[test]
fn two_tiers_report_the_binding_one_and_consume_from_both_or_neither() {
    // 10 per second and 50 per 10 seconds, as in the multi-tenant seed.
    let limiter = manual(
        Algorithm::FixedWindow,
        [Tier::per_second(10), Tier::new(50, Duration::from_secs(10))],
    );
    let clock = limiter.clock().clone();
    let mut admitted = 0;
    for _ in 0..5 {
        for _ in 0..20 {
            admitted += u64::from(limiter.check_now("tenant", 1).unwrap().allowed());
        }
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(admitted, 50);
    // The per-second tier has room again; the ten-second one denies, and nothing is taken.
    let denied = limiter.check_now("tenant", 1).unwrap();
    assert_eq!(
        (denied.allowed(), denied.tier(), denied.limit()),
        (false, 1, 50)
    );
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(5)));
    clock.advance(Duration::from_secs(5));
    let fresh = limiter.check_now("tenant", 1).unwrap();
    assert_eq!(
        (fresh.allowed(), fresh.tier(), fresh.remaining()),
        (true, 0, 9)
    );
}

#[test]
fn keys_are_arbitrary_bytes() {
    let limiter = manual(Algorithm::FixedWindow, [Tier::per_second(1)]);
    let keys: [&[u8]; 5] = [
        b"",
        b"\xff\xfe not utf-8",
        b"a\0b",
        b"a\0c",
        &[0u8; MAX_KEY_LEN],
    ];
    for key in keys {
        assert!(limiter.check_now(key, 1).unwrap().allowed(), "{key:?}");
        assert!(!limiter.check_now(key, 1).unwrap().allowed(), "{key:?}");
    }
    assert_eq!(limiter.store().keys(), keys.len());
}

#[test]
fn a_huge_key_is_an_error_and_stores_nothing() {
    let limiter = manual(Algorithm::FixedWindow, [Tier::per_second(1)]);
    let err = limiter
        .check_now(vec![7u8; MAX_KEY_LEN + 1], 1)
        .unwrap_err();
    assert_eq!(
        err,
        Error::KeyTooLong {
            len: MAX_KEY_LEN + 1,
            max: MAX_KEY_LEN
        }
    );
    assert_eq!(limiter.store().keys(), 0);
}

#[test]
fn an_absurd_cost_is_an_error_that_names_the_tier_not_a_denial() {
    let limiter = manual(
        Algorithm::TokenBucket(TokenBucket::default()),
        [Tier::per_second(10).with_burst(20), Tier::per_minute(100)],
    );
    assert!(limiter.check_now("k", 20).unwrap().allowed());
    let err = limiter.check_now("k", u64::MAX).unwrap_err();
    assert!(matches!(
        err,
        Error::CostExceedsCapacity {
            tier: 0,
            capacity: 20,
            ..
        }
    ));
    assert!(err.to_string().contains("can ever admit"), "{err}");
    // Nothing was consumed by the rejected check.
    assert_eq!(limiter.check_now("k", 0).unwrap().remaining(), 0);
    assert_eq!(limiter.check_now("other", 0).unwrap().remaining(), 20);
}

#[test]
fn invalid_rules_say_which_field_and_why() {
    let cases = [
        (
            Rule::new("r", Algorithm::Gcra, [Tier::per_second(0)]),
            "tiers[0].limit",
        ),
        (
            Rule::new("r", Algorithm::Gcra, [Tier::new(1, Duration::ZERO)]),
            "tiers[0].period",
        ),
        (
            Rule::new(
                "r",
                Algorithm::FixedWindow,
                [Tier::per_second(1).with_burst(2)],
            ),
            "tiers[0].burst",
        ),
        (
            Rule::new(
                "r",
                Algorithm::WarmUp(WarmUp::new(Duration::from_millis(10))),
                [Tier::per_second(10)],
            ),
            "algorithm.warm_up",
        ),
        (
            Rule::new(
                "r",
                Algorithm::TokenBucket(TokenBucket {
                    initial_tokens: Some(11),
                }),
                [Tier::per_second(10)],
            ),
            "algorithm.initial_tokens",
        ),
    ];
    for (result, field) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.field, field);
        assert!(
            err.to_string().starts_with(&format!("rule `r`: {field}: ")),
            "{err}"
        );
    }
}

#[tokio::test]
async fn acquire_waits_for_the_next_permit() {
    let limiter = manual(Algorithm::Gcra, [Tier::per_second(10).with_burst(1)]);
    let start = limiter.clock().now_micros();
    limiter
        .acquire("k", 1, Duration::from_secs(1))
        .await
        .unwrap();
    limiter
        .acquire("k", 1, Duration::from_secs(1))
        .await
        .unwrap();
    limiter
        .acquire("k", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(limiter.clock().now_micros() - start, 200_000);
}

#[tokio::test]
async fn acquire_gives_up_at_once_when_the_timeout_cannot_be_met() {
    let limiter = manual(Algorithm::Gcra, [Tier::per_second(10).with_burst(1)]);
    limiter.check_now("k", 1).unwrap();
    let before = limiter.clock().now_micros();
    let err = limiter
        .acquire("k", 1, Duration::from_millis(50))
        .await
        .unwrap_err();
    let Error::Timeout { decision, timeout } = err else {
        panic!("expected a timeout, got {err:?}");
    };
    assert_eq!(timeout, Duration::from_millis(50));
    assert_eq!(decision.retry_after(), Some(Duration::from_millis(100)));
    // It did not sleep to find out.
    assert_eq!(limiter.clock().now_micros(), before);
}

#[tokio::test]
async fn acquire_on_a_shaper_waits_out_the_delay_it_was_given() {
    let limiter = manual(
        Algorithm::LeakyBucket(LeakyBucket::Shaper),
        [Tier::per_second(10)],
    );
    let start = limiter.clock().now_micros();
    for _ in 0..3 {
        limiter
            .acquire("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
    }
    // Admitted at 0, 100 and 200 ms: the caller returns when its turn has come.
    assert_eq!(limiter.clock().now_micros() - start, 200_000);
    // One permit is still ahead in the bucket. A caller that would wait longer than its
    // timeout is not admitted, and takes nothing.
    let err = limiter.acquire("k", 8, Duration::from_millis(50)).await;
    assert!(matches!(err, Err(Error::Timeout { .. })));
    assert_eq!(limiter.check_now("k", 0).unwrap().remaining(), 9);
}

#[tokio::test]
async fn acquire_on_warm_up_ramps_like_guava() {
    let limiter = manual(
        Algorithm::WarmUp(WarmUp::new(Duration::from_secs(2))),
        [Tier::per_second(10)],
    );
    let clock = limiter.clock().clone();
    let mut gaps = Vec::new();
    let mut last = clock.now_micros();
    for _ in 0..4 {
        limiter
            .acquire("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        gaps.push((clock.now_micros() - last) / 1_000);
        last = clock.now_micros();
    }
    assert_eq!(gaps, [0, 290, 270, 250]);
}

#[tokio::test]
async fn acquire_on_the_system_clock_really_waits() {
    let rule = Rule::new(
        "api",
        Algorithm::Gcra,
        [Tier::per_second(200).with_burst(1)],
    )
    .unwrap();
    let limiter = Limiter::new(rule);
    let clock = SystemClock::new();
    let start = clock.now_micros();
    for _ in 0..3 {
        limiter
            .acquire(b"k", 1, Duration::from_secs(5))
            .await
            .unwrap();
    }
    // Two waits of 5 ms each, at least: a lower bound only, never an upper one.
    assert!(clock.now_micros() - start >= 10_000);
}

/// A plan sold per calendar month in Paris: its window ends at midnight on the 1st, Paris
/// time, whatever the month's length; the fields say the real time left.
#[test]
fn a_calendar_month_resets_at_midnight_on_the_first_in_its_zone() {
    use tollgate::Calendar;
    let month = Calendar::month().in_zone("Europe/Paris").unwrap();
    let rule = Rule::new("plan", Algorithm::FixedWindow, [Tier::calendar(3, month)]).unwrap();
    // 31 January 2025, 23:59 in Paris (22:59 UTC).
    let clock = ManualClock::at_micros(1_738_364_340_000_000);
    let limiter = Limiter::builder(rule).clock(clock.clone()).build().unwrap();
    for left in [2, 1, 0] {
        assert_eq!(limiter.check_now("acme", 1).unwrap().remaining(), left);
    }
    let denied = limiter.check_now("acme", 1).unwrap();
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(denied.reset_after(), Duration::from_secs(60));
    // Midnight in Paris: February's plan, 28 days of it.
    clock.advance(Duration::from_secs(60));
    let february = limiter.check_now("acme", 1).unwrap();
    assert_eq!((february.allowed(), february.remaining()), (true, 2));
    assert_eq!(february.reset_after(), Duration::from_secs(28 * 86_400));
    // The policy advertised: 3 per the longest month and an hour (Paris changes its clocks).
    assert_eq!(february.window(), Duration::from_secs(31 * 86_400 + 3_600));
}

#[test]
fn a_calendar_period_takes_only_the_windowed_algorithms() {
    use tollgate::Calendar;
    for algorithm in [Algorithm::FixedWindow, Algorithm::HitCounter] {
        assert!(Rule::new("ok", algorithm, [Tier::calendar(5, Calendar::day())]).is_ok());
    }
    let e = Rule::new("no", Algorithm::Gcra, [Tier::calendar(5, Calendar::day())]).unwrap_err();
    assert_eq!(e.field, "tiers[0].period");
    assert!(e.reason.contains("fixed_window or hit_counter"), "{e}");
}
