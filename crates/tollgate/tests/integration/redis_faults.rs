//! When Redis fails: killed mid-run, restarted, frozen (SIGSTOP) and thawed, or never there.
//! Every check returns within the timeout plus a margin, decided by the configured policy, and
//! strict limiting resumes when Redis is back.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::{RedisServer, UnusedPort};
use tollgate::{Algorithm, FailurePolicy, Limiter, RedisStore, Rule, Source, StoreFailures, Tier};

const TIMEOUT: Duration = Duration::from_millis(20);
/// Scheduling slack on a shared two-core machine; a hang would exceed it by far.
const MARGIN: Duration = Duration::from_millis(500);

type RedisLimiter = Limiter<RedisStore>;

async fn limiter(url: &str, policy: FailurePolicy) -> Arc<RedisLimiter> {
    let rule = Rule::new("faults", Algorithm::FixedWindow, [Tier::per_minute(10)])
        .and_then(|rule| rule.on_failure(policy))
        .unwrap();
    let store = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .circuit_breaker(3, Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    Arc::new(Limiter::builder(rule).store(store).build().unwrap())
}

/// Background load: 16 tasks checking distinct keys until stopped; records every source seen
/// and the slowest call.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(BTreeSet<String>, Duration)>>,
}

impl Load {
    fn start(limiter: &Arc<RedisLimiter>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..16)
            .map(|t| {
                let (limiter, stop) = (limiter.clone(), stop.clone());
                tokio::spawn(async move {
                    let (mut sources, mut slowest) = (BTreeSet::new(), Duration::ZERO);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let decision = limiter.check(format!("load-{t}-{n}"), 1).await.unwrap();
                        slowest = slowest.max(started.elapsed());
                        sources.insert(format!("{:?}", decision.source()));
                        n += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    (sources, slowest)
                })
            })
            .collect();
        Self { stop, tasks }
    }

    async fn finish(self) -> (BTreeSet<String>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut sources, mut slowest) = (BTreeSet::new(), Duration::ZERO);
        for task in self.tasks {
            let (s, d) = task.await.unwrap();
            sources.extend(s);
            slowest = slowest.max(d);
        }
        (sources, slowest)
    }
}

/// Checks until Redis decides again (or gives up after 10 s); returns that decision's source.
async fn wait_for_redis(limiter: &RedisLimiter, key: &str) -> Source {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let decision = limiter.check(key, 0).await.unwrap();
        if decision.source() == Source::Redis || Instant::now() > deadline {
            return decision.source();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After recovery the limit is strict again: exactly 10 of 15 admitted, all by Redis.
async fn assert_strict(limiter: &RedisLimiter, key: &str) {
    let mut admitted = 0;
    for _ in 0..15 {
        let decision = limiter.check(key, 1).await.unwrap();
        assert_eq!(decision.source(), Source::Redis);
        admitted += u32::from(decision.allowed());
    }
    assert_eq!(admitted, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_fails_open_then_resumes_strict_limiting() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server.url(), FailurePolicy::Open).await;
    // Connected, the library loaded: a first call may take longer than the timeout.
    assert_eq!(wait_for_redis(&limiter, "warm").await, Source::Redis);
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = limiter.store().failures();
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = limiter.check("during", 1).await.unwrap();
    assert_eq!(
        (during.allowed(), during.source()),
        (true, Source::FailOpen)
    );
    let failed = limiter.store().failures();
    assert!(
        failed.errors + failed.timeouts > before.errors + before.timeouts,
        "{before:?} then {failed:?}"
    );
    server.restart();
    assert_eq!(wait_for_redis(&limiter, "probe").await, Source::Redis);
    assert!(!limiter.store().degraded());
    let (sources, slowest) = load.finish().await;
    println!("slowest call during the outage: {slowest:?}");
    assert!(slowest <= TIMEOUT + MARGIN, "slowest call took {slowest:?}");
    assert!(
        sources.contains("Redis") && sources.contains("FailOpen"),
        "{sources:?}"
    );
    assert_strict(&limiter, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_fails_closed_within_the_timeout_then_thaws() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url(), FailurePolicy::Closed).await;
    // Connected, the library loaded: a first call may take longer than the timeout.
    assert_eq!(wait_for_redis(&limiter, "warm").await, Source::Redis);
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = limiter.store().failures();
    assert!(!limiter.store().degraded());
    server.pause();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = Instant::now();
    let during = limiter.check("during", 1).await.unwrap();
    assert!(started.elapsed() <= TIMEOUT + MARGIN);
    assert_eq!(
        (during.allowed(), during.source()),
        (false, Source::FailClosed)
    );
    assert!(during.retry_after().is_some());
    // A frozen server answers nothing: its calls time out, none fails with an error.
    let failed = limiter.store().failures();
    assert!(
        failed.timeouts >= before.timeouts + 3,
        "{before:?} then {failed:?}"
    );
    assert_eq!(failed.errors, before.errors);
    assert!(limiter.store().degraded());
    server.resume();
    assert_eq!(wait_for_redis(&limiter, "probe").await, Source::Redis);
    assert!(!limiter.store().degraded());
    let (sources, slowest) = load.finish().await;
    println!("slowest call during the outage: {slowest:?}");
    assert!(slowest <= TIMEOUT + MARGIN, "slowest call took {slowest:?}");
    assert!(sources.contains("FailClosed"), "{sources:?}");
    assert_strict(&limiter, "after").await;
}

/// Checks written in one pipeline with a command that has no deadline (a ping) each time
/// out by their own deadline, counted as timeouts, while the ping waits for its answer until
/// the server thaws. The server thaws only once every check has answered: a check that
/// waited for the thaw would never answer (the test gives up after 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_in_a_pipeline_time_out_by_their_own_deadline() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url(), FailurePolicy::Closed).await;
    assert_eq!(wait_for_redis(&limiter, "warm").await, Source::Redis);
    let before = limiter.store().failures();
    server.pause();
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let check = |key: &'static str| {
        let (limiter, answered) = (limiter.clone(), answered.clone());
        async move {
            let decision = limiter.check(key, 1).await.unwrap();
            let _ = answered.send(());
            (decision.allowed(), decision.source())
        }
    };
    let pinged = AtomicBool::new(false);
    let store = limiter.store().clone();
    // Polled in this order in one pass: the first check goes alone, the ping and the other
    // checks wait for it, so they are queued and written together.
    let (first, pong, second, third, pinged_before_the_thaw) = tokio::join!(
        check("first"),
        async {
            let pong = store.ping().await;
            pinged.store(true, Ordering::SeqCst);
            pong
        },
        check("second"),
        check("third"),
        async {
            let three = async {
                for _ in 0..3 {
                    answers.recv().await;
                }
            };
            let waited = tokio::time::timeout(Duration::from_secs(10), three).await;
            assert!(waited.is_ok(), "a check waited for the thaw");
            let pinged = pinged.load(Ordering::SeqCst);
            server.resume();
            pinged
        },
    );
    for decision in [first, second, third] {
        assert_eq!(decision, (false, Source::FailClosed));
    }
    assert!(
        !pinged_before_the_thaw,
        "the ping did not wait for its answer"
    );
    assert!(pong.is_ok(), "{pong:?}");
    let failed = limiter.store().failures();
    assert_eq!(failed.timeouts, before.timeouts + 3, "{failed:?}");
    assert_eq!(failed.errors, before.errors, "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_a_local_share_of_the_limit() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server.url(), FailurePolicy::Local { share: 0.5 }).await;
    assert_eq!(wait_for_redis(&limiter, "warm").await, Source::Redis);
    server.kill();
    // This instance alone enforces half the limit: 5 of 10 per minute.
    let mut admitted = 0;
    for _ in 0..10 {
        let decision = limiter.check("k", 1).await.unwrap();
        assert_eq!(decision.source(), Source::Fallback);
        admitted += u32::from(decision.allowed());
    }
    assert_eq!(admitted, 5);
    server.restart();
    assert_eq!(wait_for_redis(&limiter, "probe").await, Source::Redis);
    assert_strict(&limiter, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_started_is_a_policy_decision_not_an_error() {
    // A port with nothing listening: the store opens lazily and checks are decided by policy.
    let unused = UnusedPort::new();
    let url = format!("redis://127.0.0.1:{}", unused.port);
    let limiter = limiter(&url, FailurePolicy::Closed).await;
    assert_eq!(limiter.store().failures(), StoreFailures::default());
    for _ in 0..10 {
        let started = Instant::now();
        let decision = limiter.check("k", 1).await.unwrap();
        assert!(started.elapsed() <= TIMEOUT + MARGIN);
        assert_eq!(decision.source(), Source::FailClosed);
    }
    // Three calls failed and opened the breaker (3 failures); later checks made a call only
    // as a probe after its 200 ms cooldown. Each failed call counts once.
    let failed = limiter.store().failures();
    let calls = failed.errors + failed.timeouts;
    assert!((3..=10).contains(&calls), "{failed:?}");
    assert!(limiter.store().degraded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_cancelled_by_its_caller_does_not_keep_the_breaker_open() {
    let server = RedisServer::start();
    let rule = Rule::new("probe", Algorithm::FixedWindow, [Tier::per_minute(10)]).unwrap();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_millis(300))
        .circuit_breaker(1, Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    assert_eq!(wait_for_redis(&limiter, "warm").await, Source::Redis);
    server.pause();
    // One failure opens the breaker.
    assert_eq!(
        limiter.check("k", 1).await.unwrap().source(),
        Source::FailOpen
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The cooldown is over: this check probes the frozen server, and its caller gives up
    // first (a client that went away, an outer timeout).
    let cancelled = tokio::time::timeout(Duration::from_millis(30), limiter.check("k", 1)).await;
    assert!(cancelled.is_err(), "the probe was still waiting");
    server.resume();
    // The next check probes again and finds the server back.
    assert_eq!(wait_for_redis(&limiter, "after").await, Source::Redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_the_local_share_is_denied_until_redis_returns_never_a_panic() {
    let unused = UnusedPort::new();
    let url = format!("redis://127.0.0.1:{}", unused.port);
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SubWindows(tollgate::SubWindows { count: 6 }),
        Algorithm::SlidingLog,
        Algorithm::IntervalBucket,
        Algorithm::TokenBucket(tollgate::TokenBucket::default()),
        Algorithm::LeakyBucket(tollgate::LeakyBucket::Meter),
        Algorithm::Gcra,
    ];
    for algorithm in algorithms {
        let name = algorithm.name();
        // 10 per minute; a quarter of it is 3 (rounded up).
        let rule = Rule::new(name, algorithm, [Tier::per_minute(10)])
            .and_then(|rule| rule.on_failure(FailurePolicy::Local { share: 0.25 }))
            .unwrap();
        let store = RedisStore::builder(&url)
            .timeout(TIMEOUT)
            .build()
            .await
            .unwrap();
        let limiter = Limiter::builder(rule).store(store).build().unwrap();
        let denied = limiter.check("k", 5).await.unwrap();
        assert_eq!(
            (denied.allowed(), denied.source()),
            (false, Source::Fallback),
            "{name}"
        );
        assert_eq!(denied.limit(), 3, "{name}");
        assert!(denied.retry_after().is_some(), "{name}");
        // What the share can hold is decided locally as ever.
        let admitted = limiter.check("k", 3).await.unwrap();
        assert_eq!(
            (admitted.allowed(), admitted.source()),
            (true, Source::Fallback),
            "{name}"
        );
        assert!(!limiter.check("k", 1).await.unwrap().allowed(), "{name}");
        // A cost above the rule itself is still an error, Redis or not.
        assert!(limiter.check("k", 11).await.is_err(), "{name}");
    }
}

/// A server at Redis's address that is not Redis (or not well): each connection it takes
/// answers the first command with one of these and then waits for the client to leave.
const NOT_REDIS: [&[u8]; 4] = [
    b"\r\n",
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
    b"hello",
    // A line that never ends, longer than any Redis sends (2 MiB).
    &[b'+'; 2 << 20],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_redis_is_a_policy_decision_at_once_never_a_panic() {
    use std::io::{Read, Write};
    let panics = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = panics.clone();
    std::panic::set_hook(Box::new(move |info| {
        seen.lock().unwrap().push(info.to_string())
    }));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            counter.fetch_add(1, Ordering::Relaxed);
            std::thread::spawn(move || {
                let mut buffer = [0; 4096];
                if matches!(stream.read(&mut buffer), Ok(1..)) {
                    let _ = stream.write_all(NOT_REDIS[n % NOT_REDIS.len()]);
                }
                // Until the client leaves.
                while matches!(stream.read(&mut buffer), Ok(1..)) {}
            });
        }
    });

    let rule = Rule::new("not-redis", Algorithm::FixedWindow, [Tier::per_minute(10)])
        .and_then(|rule| rule.on_failure(FailurePolicy::Closed))
        .unwrap();
    // A timeout far above how long a refusal takes (and below the 2 s after which a link
    // with no reply is closed), and a breaker that stays shut, so that every check makes its
    // call and a reply waited on counts as a timeout.
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_secs(1))
        .circuit_breaker(1000, Duration::from_millis(1))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    for n in 0..12 {
        let decision = limiter.check(format!("k{n}"), 1).await.unwrap();
        assert_eq!(decision.source(), Source::FailClosed);
    }
    let failed = limiter.store().failures();
    assert_eq!(
        failed.timeouts, 0,
        "a reply that cannot be Redis's was waited on"
    );
    assert!(failed.errors >= 12, "{failed:?}");
    assert!(
        accepted.load(Ordering::Relaxed) >= NOT_REDIS.len(),
        "every answer was tried"
    );
    // A call with no failure policy (reservations past their expiry) gets the error, said
    // once: what the connection found, after one "store:".
    let err = limiter.settle_expired(10).await.unwrap_err().to_string();
    let _ = std::panic::take_hook();
    assert_eq!(*panics.lock().unwrap(), Vec::<String>::new());
    assert!(
        err.starts_with("store: ") && !err.starts_with("store: store:") && err.contains("Redis"),
        "{err}"
    );
}
