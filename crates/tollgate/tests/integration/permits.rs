//! Concurrency rules through the limiter: slots held under a permit until released, extended
//! or their lease ends; the guard gives them back when dropped, on memory at once and on
//! Redis in the background; exact under concurrent holders on both.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, Error, Item, Limiter, ManualClock, RedisStore, Rule, Store, Tier,
};

fn exports(limit: u64, lease: Duration) -> Rule {
    Rule::new("exports", Algorithm::Concurrency, [Tier::new(limit, lease)]).unwrap()
}

#[tokio::test]
async fn a_permit_holds_its_slots_until_released_extended_or_its_lease_ends() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(exports(2, Duration::from_secs(30)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let item = [Item::new("exports", "acme", 1)];
    let first = limiter.hold(&item).await.unwrap();
    let permit = first.id().unwrap().to_string();
    // The permit ends a tenth of the lease early, at most a second: 29 s.
    assert_eq!(first.expires_at() - clock.now_micros(), 29_000_000);
    assert!(limiter.hold(&item).await.unwrap().allowed());
    let full = limiter.hold(&item).await.unwrap();
    assert!(!full.allowed() && full.id().is_none());

    clock.advance(Duration::from_secs(20));
    let ends = limiter.extend(&permit).await.unwrap();
    assert_eq!(ends - clock.now_micros(), 29_000_000);
    // 15 s later the other holder's lease has ended (at 30 s); this one's runs to 50 s.
    clock.advance(Duration::from_secs(15));
    let one_free = limiter.hold(&item).await.unwrap();
    assert!(one_free.allowed());
    assert!(!limiter.hold(&item).await.unwrap().allowed());
    let released = limiter.release(&permit).await.unwrap();
    assert_eq!(released[0].remaining(), 1);
    assert!(matches!(
        limiter.release(&permit).await,
        Err(Error::UnknownReservation { .. })
    ));

    // A permit past its end is unknown, and frees nothing another holder took.
    let late = one_free.id().unwrap().to_string();
    clock.advance(Duration::from_secs(29));
    assert!(matches!(
        limiter.extend(&late).await,
        Err(Error::UnknownReservation { .. })
    ));
    assert!(matches!(
        limiter.release(&late).await,
        Err(Error::UnknownReservation { .. })
    ));
}

#[tokio::test]
async fn a_permit_gives_its_slots_back_when_dropped() {
    let limiter = Arc::new(Limiter::new(exports(1, Duration::from_secs(60))));
    let item = [Item::new("exports", "acme", 1)];
    let permit = limiter.permit(&item).await.unwrap();
    assert!(permit.allowed() && permit.id().is_some());
    let refused = limiter.permit(&item).await.unwrap();
    assert!(!refused.allowed() && refused.id().is_none());
    drop(refused);
    drop(permit);
    let again = limiter.permit(&item).await.unwrap();
    assert!(again.allowed());
    let released = again.release().await.unwrap();
    assert_eq!(released[0].remaining(), 1);
}

/// A check without a permit holds its slots for the lease; other rules in a held batch take
/// their cost as a check does, and a release gives back only the slots.
#[tokio::test]
async fn only_slots_are_held_and_given_back() {
    let rate = Rule::new("rate", Algorithm::FixedWindow, [Tier::per_hour(10)]).unwrap();
    let limiter = Limiter::builder(exports(1, Duration::from_secs(60)))
        .rule(rate)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let items = [Item::new("exports", "k", 1), Item::new("rate", "k", 1)];
    let held = limiter.hold(&items).await.unwrap();
    let decisions = limiter.release(held.id().unwrap()).await.unwrap();
    assert_eq!(decisions.len(), 1, "the permit holds the slot only");
    assert_eq!(decisions[0].rule(), "exports");
    let look = limiter
        .check_batch(&[Item::new("rate", "k", 0)])
        .await
        .unwrap();
    assert_eq!(
        look[0].remaining(),
        9,
        "the rate rule keeps what the check took"
    );
    // Without a concurrency rule among the items, no permit.
    let plain = limiter.hold(&[Item::new("rate", "k", 1)]).await.unwrap();
    assert!(plain.allowed() && plain.id().is_none());
}

/// Many tasks competing for 3 slots: never more than 3 running at once, on `limiter`.
async fn never_more_than_the_slots<S: Store>(limiter: Arc<Limiter<S>>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (limiter, running, most) = (limiter.clone(), running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let item = [Item::new("exports", "one", 1)];
            let mut done = 0;
            for _ in 0..10_000 {
                let permit = limiter.permit(&item).await.unwrap();
                if !permit.allowed() {
                    tokio::task::yield_now().await;
                    continue;
                }
                // Admitted without a permit only by a failure policy (Redis slow), which says
                // so: no slot was taken, so it is not counted as holding one.
                if permit.id().is_none() {
                    assert_eq!(permit.decision().source(), tollgate::Source::FailOpen);
                    continue;
                }
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
                done += 1;
                if done == 5 {
                    return;
                }
            }
            panic!("a task never got its turns");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=3).contains(&most), "{most} running at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_holders_never_exceed_the_slots_in_memory() {
    never_more_than_the_slots(Arc::new(Limiter::new(exports(3, Duration::from_secs(60))))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_holders_never_exceed_the_slots_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder(exports(3, Duration::from_secs(60)))
        .store(store.clone())
        .build()
        .unwrap();
    let limiter = Arc::new(limiter);
    never_more_than_the_slots(limiter.clone()).await;
    // A guard dropped on Redis gives its slots back in the background.
    let item = [Item::new("exports", "dropped", 3)];
    drop(limiter.permit(&item).await.unwrap());
    let mut freed = false;
    for _ in 0..200 {
        if limiter
            .check_batch(&[Item::new("exports", "dropped", 0)])
            .await
            .unwrap()[0]
            .remaining()
            == 3
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the dropped permit's slots came back");
}
