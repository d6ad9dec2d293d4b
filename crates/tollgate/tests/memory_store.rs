//! The memory store as a shared, bounded table: exact key bounds, byte bounds, which keys a
//! flood evicts, many rules on one store, and state that survives an edit of a rule's limit.

use std::time::Duration;

use tollgate::{
    Algorithm, Clock, Error, Item, Limiter, ManualClock, MemoryStore, Rule, Source, Tier,
};

fn limiter(
    store: &MemoryStore,
    clock: &ManualClock,
    rule: Rule,
) -> Limiter<MemoryStore, ManualClock> {
    Limiter::builder(rule)
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn per_day(name: &str, algorithm: Algorithm, limit: u64) -> Rule {
    Rule::new(name, algorithm, [Tier::per_day(limit)]).unwrap()
}

#[test]
fn max_keys_holds_exactly_that_many_keys() {
    let store = MemoryStore::builder().max_keys(10_000).build();
    let clock = ManualClock::new();
    let limiter = limiter(&store, &clock, per_day("n", Algorithm::FixedWindow, 5));
    for i in 0..10_000u32 {
        limiter.check_now(i.to_be_bytes(), 1).unwrap();
    }
    assert_eq!((store.keys(), store.evictions()), (10_000, 0));
    limiter.check_now(b"one more", 1).unwrap();
    assert_eq!((store.keys(), store.evictions()), (10_000, 1));
}

#[test]
fn a_flood_of_new_keys_does_not_reset_a_used_up_key() {
    let store = MemoryStore::builder().max_keys(10_000).build();
    let clock = ManualClock::new();
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        let name = algorithm.name();
        let limiter = limiter(&store, &clock, per_day(name, algorithm, 20));
        for _ in 0..20 {
            assert!(limiter.check_now(b"victim", 1).unwrap().allowed());
        }
        // An hour later: the victim's state now ends before any new key's.
        clock.advance(Duration::from_secs(3_600));
        for i in 0..12_000u32 {
            limiter.check_now(i.to_be_bytes(), 1).unwrap();
            assert!(store.keys() <= 10_000);
        }
        assert!(store.evictions() >= 2_000, "{name}: {}", store.evictions());
        let victim = limiter.check_now(b"victim", 1).unwrap();
        assert!(
            !victim.allowed(),
            "{name}: a used-up key was reset by the flood"
        );
        clock.advance(Duration::from_secs(2 * 86_400));
    }
}

#[test]
fn bytes_bound_a_log_of_large_states() {
    // A sliding log of 100k per key keeps 800 kB per key: 8 MiB hold ten keys.
    let store = MemoryStore::builder().max_bytes(8 << 20).build();
    let clock = ManualClock::new();
    let limiter = limiter(
        &store,
        &clock,
        per_day("log", Algorithm::SlidingLog, 100_000),
    );
    for i in 0..50u32 {
        assert!(limiter.check_now(i.to_be_bytes(), 1).unwrap().allowed());
        assert!(store.bytes() <= 8 << 20, "{} bytes", store.bytes());
    }
    assert!((9..=10).contains(&store.keys()), "{} keys", store.keys());
    // A rule whose single key could never fit is refused when it is planned.
    let tiny = MemoryStore::builder().max_bytes(100_000).build();
    let rule = per_day("huge", Algorithm::SlidingLog, 100_000);
    let err = Limiter::builder(rule).store(tiny).build().unwrap_err();
    assert!(matches!(err, Error::Rule(_)), "{err}");
    assert!(err.to_string().contains("max_bytes"), "{err}");
}

#[test]
fn rules_share_one_store_and_its_bound_but_not_their_counts() {
    let store = MemoryStore::builder().max_keys(100).build();
    let clock = ManualClock::new();
    let a = limiter(&store, &clock, per_day("a", Algorithm::FixedWindow, 1));
    let b = limiter(&store, &clock, per_day("b", Algorithm::Gcra, 1));
    assert!(a.check_now(b"k", 1).unwrap().allowed());
    assert!(
        b.check_now(b"k", 1).unwrap().allowed(),
        "b counts apart from a"
    );
    assert!(!a.check_now(b"k", 1).unwrap().allowed());
    assert_eq!(store.keys(), 2);
    for i in 0..200u32 {
        a.check_now(i.to_be_bytes(), 1).unwrap();
        b.check_now(i.to_be_bytes(), 1).unwrap();
    }
    assert_eq!(store.keys(), 100);
}

#[test]
fn an_edited_limit_keeps_the_state_of_every_key() {
    // GCRA keeps time owed rather than permits: a day owed is a day owed at any rate.
    for (algorithm, left) in [
        (Algorithm::FixedWindow, 5),
        (Algorithm::SlidingWindow, 5),
        (Algorithm::SlidingLog, 5),
        (Algorithm::IntervalBucket, 5),
        (Algorithm::Gcra, 0),
    ] {
        let name = algorithm.name();
        let store = MemoryStore::new();
        let clock = ManualClock::new();
        let before = limiter(&store, &clock, per_day(name, algorithm.clone(), 20));
        for _ in 0..20 {
            assert!(before.check_now(b"tenant", 1).unwrap().allowed(), "{name}");
        }
        // A hot reload raises the limit: the tenant has 5 left, not a fresh 25.
        let after = limiter(&store, &clock, per_day(name, algorithm.clone(), 25));
        let mut admitted = 0;
        for _ in 0..30 {
            admitted += u32::from(after.check_now(b"tenant", 1).unwrap().allowed());
        }
        assert_eq!(admitted, left, "{name}");
        // Lowering it below what was used denies at once.
        let lower = limiter(&store, &clock, per_day(name, algorithm.clone(), 10));
        assert!(!lower.check_now(b"tenant", 1).unwrap().allowed(), "{name}");
        // A new period is a new layout: a fresh start.
        let hourly = Rule::new(name, algorithm, [Tier::per_hour(25)]).unwrap();
        let hourly = limiter(&store, &clock, hourly);
        assert_eq!(
            hourly.check_now(b"tenant", 0).unwrap().remaining(),
            25,
            "{name}"
        );
    }
}

#[test]
fn a_sliding_log_edited_down_keeps_its_most_recent_permits() {
    let store = MemoryStore::new();
    let clock = ManualClock::new();
    let hour = Tier::per_hour;
    let log = |limit| Rule::new("log", Algorithm::SlidingLog, [hour(limit)]).unwrap();
    let before = limiter(&store, &clock, log(6));
    for _ in 0..6 {
        before.check_now(b"k", 1).unwrap();
        clock.advance(Duration::from_secs(60));
    }
    // Permits at 0..5 minutes. With a limit of 3, the three most recent (3, 4, 5 min) stay:
    // the oldest of them leaves the window at 63 min.
    let after = limiter(&store, &clock, log(3));
    let denied = after.check_now(b"k", 1).unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(57 * 60)));
}

#[test]
fn a_batch_across_rules_consumes_from_all_or_from_none() {
    let clock = ManualClock::new();
    let tenant = Rule::new("tenant", Algorithm::FixedWindow, [Tier::per_minute(10)]).unwrap();
    let ip = Rule::new("ip", Algorithm::Gcra, [Tier::per_minute(2)]).unwrap();
    let limiter = Limiter::builder(tenant)
        .rule(ip)
        .clock(clock.clone())
        .build()
        .unwrap();
    let batch = |ip: &'static str| [Item::new("tenant", "acme", 1), Item::new("ip", ip, 1)];
    assert!(
        limiter
            .check_batch_now(&batch("1.2.3.4"))
            .unwrap()
            .allowed()
    );
    assert!(
        limiter
            .check_batch_now(&batch("1.2.3.4"))
            .unwrap()
            .allowed()
    );
    // The IP is used up: the batch is denied, and the tenant's count does not move.
    let denied = limiter.check_batch_now(&batch("1.2.3.4")).unwrap();
    assert!(!denied.allowed());
    assert!(denied[0].allowed() && !denied[1].allowed());
    assert_eq!(denied.binding().unwrap().rule(), "ip");
    let look = limiter
        .check_batch_now(&[Item::new("tenant", "acme", 0)])
        .unwrap();
    assert_eq!(look[0].remaining(), 8);
    // Another IP of the same tenant passes.
    assert!(
        limiter
            .check_batch_now(&batch("5.6.7.8"))
            .unwrap()
            .allowed()
    );
    // Items of one rule and key add up; unknown rules and huge batches are errors.
    let twice = [Item::new("ip", "9.9.9.9", 1), Item::new("ip", "9.9.9.9", 1)];
    let both = limiter.check_batch_now(&twice).unwrap();
    assert!(both.allowed() && both[0] == both[1]);
    assert_eq!(both[0].remaining(), 0);
    // A repeat between other items: one decision per item given, in order.
    let mixed = [
        Item::new("tenant", "beta", 1),
        Item::new("ip", "7.7.7.7", 1),
        Item::new("ip", "7.7.7.7", 1),
        Item::new("tenant", "gamma", 3),
    ];
    let each = limiter.check_batch_now(&mixed).unwrap();
    let rules: Vec<_> = each.iter().map(|d| d.rule()).collect();
    assert_eq!(rules, ["tenant", "ip", "ip", "tenant"]);
    assert!(each.allowed() && each[1] == each[2] && each[1].remaining() == 0);
    assert_eq!(each[0].remaining() - each[3].remaining(), 2);
    let err = limiter
        .check_batch_now(&[Item::new("nope", "k", 1)])
        .unwrap_err();
    assert_eq!(err.to_string(), "unknown rule `nope`");
    let many = vec![Item::new("tenant", "k", 0); tollgate::MAX_BATCH + 1];
    assert!(matches!(
        limiter.check_batch_now(&many),
        Err(Error::TooManyItems { .. })
    ));
}

#[test]
fn a_limiter_of_several_rules_asks_them_all_about_a_key() {
    let clock = ManualClock::new();
    let second = Rule::new("second", Algorithm::Gcra, [Tier::per_second(2)]).unwrap();
    let day = Rule::new("day", Algorithm::SlidingLog, [Tier::per_day(3)]).unwrap();
    let limiter = Limiter::builder(second)
        .rule(day)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(limiter.check_now(b"k", 2).unwrap().allowed());
    let denied = limiter.check_now(b"k", 1).unwrap();
    assert_eq!((denied.allowed(), denied.rule()), (false, "second"));
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check_now(b"k", 1).unwrap().allowed());
    clock.advance(Duration::from_secs(1));
    let denied = limiter.check_now(b"k", 1).unwrap();
    assert_eq!(
        (denied.rule(), denied.window()),
        ("day", Duration::from_secs(86_400))
    );
    assert_eq!(denied.source(), Source::Memory);
    // Two rules of one name are refused.
    let again = Rule::new("day", Algorithm::Gcra, [Tier::per_second(2)]).unwrap();
    let err = Limiter::builder(again.clone())
        .rule(again)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("two rules"), "{err}");
}

#[test]
fn a_shadow_rule_counts_but_never_denies() {
    let clock = ManualClock::new();
    let rule = Rule::new("shadow", Algorithm::FixedWindow, [Tier::per_minute(2)])
        .unwrap()
        .shadow(true);
    let store = MemoryStore::new();
    let limiter = limiter(&store, &clock, rule);
    let decisions: Vec<_> = (0..4)
        .map(|_| limiter.check_now(b"k", 1).unwrap())
        .collect();
    assert!(decisions.iter().all(|d| d.allowed()));
    let shadowed: Vec<bool> = decisions.iter().map(|d| d.shadowed()).collect();
    assert_eq!(shadowed, [false, false, true, true]);
    assert_eq!(decisions[3].remaining(), 0);
    assert_eq!(clock.now_micros(), ManualClock::DEFAULT_START_MICROS);
}
