//! The retry helper on a manual clock: it never retries before the server's hint, keeps its
//! total wait within the budget, and stops at once on a final error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::retry::{Backoff, Verdict, retry};
use tollgate::{Clock, ManualClock};

/// What a call answers: its result, or the wait the server asked for.
type Answer = std::future::Ready<Result<&'static str, Option<Duration>>>;
/// When each call was made (µs on the manual clock).
type Calls = Arc<Mutex<Vec<u64>>>;

/// A call that fails `fails` times, asking to wait `hint`, recording when it was made.
fn flaky(
    clock: &ManualClock,
    fails: usize,
    hint: Option<Duration>,
) -> (impl FnMut() -> Answer, Calls) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (clock, seen) = (clock.clone(), calls.clone());
    let op = move || {
        let mut calls = seen.lock().unwrap();
        calls.push(clock.now_micros());
        std::future::ready(if calls.len() > fails {
            Ok("ok")
        } else {
            Err(hint)
        })
    };
    (op, calls)
}

#[tokio::test]
async fn never_retries_before_the_servers_hint() {
    let clock = ManualClock::new();
    let hint = Some(Duration::from_secs(7));
    let (op, calls) = flaky(&clock, 3, hint);
    let result = retry(&clock, Backoff::default(), op, |h| Verdict::RetryAfter(*h)).await;
    assert_eq!(result, Ok("ok"));
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 4);
    for pair in calls.windows(2) {
        assert!(pair[1] - pair[0] >= 7_000_000, "{calls:?}");
    }
}

#[tokio::test]
async fn the_total_wait_stays_within_the_budget() {
    let clock = ManualClock::new();
    let start = clock.now_micros();
    let backoff = Backoff {
        budget: Duration::from_secs(20),
        retries: 100,
        ..Backoff::default()
    };
    // The server asks for 6 s each time: three retries fit in 20 s, a fourth would not.
    let (op, calls) = flaky(&clock, usize::MAX, Some(Duration::from_secs(6)));
    let result = retry(&clock, backoff, op, |h| Verdict::RetryAfter(*h)).await;
    assert_eq!(result, Err(Some(Duration::from_secs(6))));
    assert_eq!(calls.lock().unwrap().len(), 4);
    assert!(clock.now_micros() - start <= 20_000_000);
}

#[tokio::test]
async fn retries_are_counted_and_final_errors_stop_at_once() {
    let clock = ManualClock::new();
    let backoff = Backoff {
        retries: 2,
        ..Backoff::default()
    };
    let (op, calls) = flaky(&clock, usize::MAX, None);
    let _ = retry(&clock, backoff, op, |_| Verdict::RetryAfter(None)).await;
    assert_eq!(calls.lock().unwrap().len(), 3);
    let (op, calls) = flaky(&clock, usize::MAX, None);
    let _ = retry(&clock, backoff, op, |_| Verdict::Fail).await;
    assert_eq!(calls.lock().unwrap().len(), 1);
}

#[cfg(feature = "tower")]
mod policy {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use tollgate::retry::{Backoff, RetryPolicy};
    use tower::{ServiceBuilder, ServiceExt};

    #[tokio::test(start_paused = true)]
    async fn the_tower_policy_waits_out_retry_after() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let server = tower::service_fn(move |_: Request<String>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = Response::new(String::new());
                if n < 2 {
                    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    response
                        .headers_mut()
                        .insert("retry-after", "3".parse().unwrap());
                }
                Ok::<_, Infallible>(response)
            }
        });
        let client = ServiceBuilder::new()
            .retry(RetryPolicy::new(Backoff::default()))
            .service(server);
        let started = tokio::time::Instant::now();
        let response = client
            .oneshot(Request::new("body".to_string()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(started.elapsed() >= Duration::from_secs(6));
    }
}
