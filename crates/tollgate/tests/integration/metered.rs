//! What a debt does, algorithm by algorithm: a report of 25 against 10 per 10 s (a burst of 10
//! for the buckets) on a key never seen, then when the key is admitted again. The Redis
//! functions decide as these do (tests/redis_differential.rs drives reports and give-backs
//! through both); the stores' own behaviours are in tests/behaviour.rs.

use std::time::Duration;

use tollgate::{
    Algorithm, Error, Item, LeakyBucket, Limiter, ManualClock, MemoryStore, Rule, SubWindows, Tier,
    TokenBucket, WarmUp,
};

const SECOND: Duration = Duration::from_secs(1);

/// A limiter of `algorithm` at 10 per 10 s on a manual clock at a whole window (100 s).
fn limiter(algorithm: Algorithm) -> (Limiter<MemoryStore, ManualClock>, ManualClock) {
    let tier = Tier::new(10, 10 * SECOND);
    let tier = match algorithm {
        Algorithm::TokenBucket(_) | Algorithm::LeakyBucket(_) | Algorithm::Gcra => {
            tier.with_burst(10)
        }
        _ => tier,
    };
    let rule = Rule::new("debt", algorithm, [tier]).unwrap();
    let clock = ManualClock::new();
    clock.advance(100 * SECOND);
    let limiter = Limiter::builder(rule).clock(clock.clone()).build().unwrap();
    (limiter, clock)
}

/// Reports 25, then checks one permit just before `paid` and at it (from the report).
async fn debt(algorithm: Algorithm, paid: Duration) {
    let name = algorithm.name();
    let (limiter, clock) = limiter(algorithm);
    let after = limiter.report("k", 25).await.unwrap();
    assert_eq!(after.remaining(), 0, "{name}");
    if name == "sliding_log" {
        // A full log, not more: a look admits, a permit does not.
        assert!(
            after.allowed() && !limiter.check_now("k", 1).unwrap().allowed(),
            "{name}"
        );
    } else {
        assert!(
            !after.allowed(),
            "{name}: in debt after the report: {after:?}"
        );
        let wait = after.retry_after().unwrap();
        assert!(
            wait > Duration::ZERO && wait <= paid,
            "{name}: {wait:?} against {paid:?}"
        );
    }
    clock.advance(paid - Duration::from_millis(1));
    let early = limiter.check_now("k", 1).unwrap();
    assert!(
        !early.allowed(),
        "{name}: admitted before the debt is paid: {early:?}"
    );
    assert!(
        early.retry_after().unwrap() <= Duration::from_millis(1),
        "{name}: {early:?}"
    );
    clock.advance(Duration::from_millis(1));
    let paid_back = limiter.check_now("k", 1).unwrap();
    assert!(
        paid_back.allowed(),
        "{name}: still denied once paid: {paid_back:?}"
    );
}

#[tokio::test]
async fn a_fixed_window_debt_ends_with_its_window() {
    debt(Algorithm::FixedWindow, 10 * SECOND).await;
    debt(Algorithm::HitCounter, 10 * SECOND).await;
}

#[tokio::test]
async fn a_sliding_window_counter_carries_a_share_of_its_debt_into_the_next_window() {
    // 25 weighing on the next window until 25 x (1 - x / 10 s) + 1 <= 10: x = 6.4 s.
    debt(Algorithm::SlidingWindow, Duration::from_millis(16_400)).await;
}

#[tokio::test]
async fn sub_windows_hold_a_debt_until_its_sub_window_leaves() {
    debt(Algorithm::SubWindows(SubWindows { count: 10 }), 10 * SECOND).await;
}

#[tokio::test]
async fn an_interval_bucket_debt_ends_with_its_interval() {
    debt(Algorithm::IntervalBucket, 10 * SECOND).await;
}

#[tokio::test]
async fn a_sliding_log_debt_is_at_most_one_full_log() {
    // 25 reported, at most 10 logged: the log is full for one period, no longer.
    debt(Algorithm::SlidingLog, 10 * SECOND).await;
}

#[tokio::test]
async fn a_bucket_pays_its_debt_back_at_its_rate() {
    // 15 owed past empty at 1 per second, then a permit to refill: 16 s.
    for algorithm in [
        Algorithm::TokenBucket(TokenBucket::default()),
        Algorithm::LeakyBucket(LeakyBucket::Meter),
        Algorithm::LeakyBucket(LeakyBucket::Shaper),
        Algorithm::Gcra,
    ] {
        debt(algorithm, 16 * SECOND).await;
    }
}

#[tokio::test]
async fn a_warm_up_debt_moves_its_schedule_forward() {
    let (limiter, clock) = limiter(Algorithm::WarmUp(WarmUp::new(4 * SECOND)));
    let after = limiter.report("k", 25).await.unwrap();
    assert!(!after.allowed());
    let wait = after.retry_after().unwrap();
    // 25 permits take at least 25 stable intervals (1 s each), less what the cold start holds.
    assert!(wait >= 15 * SECOND && wait <= 40 * SECOND, "{wait:?}");
    clock.advance(wait);
    assert!(limiter.check_now("k", 1).unwrap().allowed());
}

#[tokio::test]
async fn a_give_back_returns_what_is_still_counted_and_never_more() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SubWindows(SubWindows { count: 10 }),
        Algorithm::SlidingLog,
        Algorithm::IntervalBucket,
        Algorithm::HitCounter,
        Algorithm::TokenBucket(TokenBucket::default()),
        Algorithm::LeakyBucket(LeakyBucket::Meter),
        Algorithm::Gcra,
    ] {
        let name = algorithm.name();
        let (limiter, _clock) = limiter(algorithm);
        let reserved = limiter
            .reserve(&[Item::new("debt", "k", 8)], None)
            .await
            .unwrap();
        assert_eq!(reserved.decision().remaining(), 2, "{name}");
        let settled = limiter.commit(reserved.id().unwrap(), 3).await.unwrap();
        assert_eq!(settled[0].remaining(), 7, "{name}: 5 of 8 given back");
        // A give-back of more than is counted stops at a full allowance.
        let reserved = limiter
            .reserve(&[Item::new("debt", "k", 1)], None)
            .await
            .unwrap();
        assert_eq!(
            limiter.cancel(reserved.id().unwrap()).await.unwrap()[0].remaining(),
            7,
            "{name}"
        );
    }
}

#[tokio::test]
async fn warm_up_keeps_what_a_reservation_took() {
    let (limiter, _clock) = limiter(Algorithm::WarmUp(WarmUp::new(4 * SECOND)));
    let reserved = limiter
        .reserve(&[Item::new("debt", "k", 1)], None)
        .await
        .unwrap();
    let before = limiter.check_now("k", 0).unwrap();
    let settled = limiter.cancel(reserved.id().unwrap()).await.unwrap();
    assert_eq!(settled[0].reset_after(), before.reset_after());
}

#[tokio::test]
async fn a_full_book_refuses_a_reservation_and_takes_nothing() {
    let store = MemoryStore::builder().max_reservations(2).build().unwrap();
    let rule = Rule::new("full", Algorithm::FixedWindow, [Tier::per_minute(100)]).unwrap();
    let limiter = Limiter::builder(rule)
        .store(store.clone())
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let item = [Item::new("full", "k", 10)];
    limiter.reserve(&item, None).await.unwrap();
    limiter.reserve(&item, None).await.unwrap();
    let refused = limiter.reserve(&item, None).await;
    assert!(
        matches!(refused, Err(Error::ReservationsFull { max: 2 })),
        "{refused:?}"
    );
    assert_eq!(store.reservations(), 2);
    assert_eq!(
        limiter.check("k", 0).await.unwrap().remaining(),
        80,
        "the refused 10 came back"
    );
}

#[tokio::test]
async fn a_full_book_makes_room_from_its_expired_reservations() {
    let store = MemoryStore::builder().max_reservations(2).build().unwrap();
    let rule = Rule::new("full", Algorithm::FixedWindow, [Tier::per_hour(100)])
        .and_then(|r| {
            r.reservations(tollgate::Reservations {
                ttl: Duration::from_secs(10),
                on_expiry: tollgate::OnExpiry::Released,
            })
        })
        .unwrap();
    let clock = ManualClock::new();
    let limiter = Limiter::builder(rule)
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let item = [Item::new("full", "k", 10)];
    limiter.reserve(&item, None).await.unwrap();
    limiter.reserve(&item, None).await.unwrap();
    clock.advance(Duration::from_secs(11));
    // Nobody swept: the full book settles the expired two, releasing their estimates.
    let kept = limiter.reserve(&item, None).await.unwrap();
    assert!(kept.id().is_some());
    assert_eq!(store.reservations(), 1);
    assert_eq!(limiter.check("k", 0).await.unwrap().remaining(), 90);
}
