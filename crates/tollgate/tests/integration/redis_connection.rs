//! Connection URLs: a password, an ACL user, a database number, TLS with a private CA, a Unix
//! socket; and how concurrent checks share a connection.

use crate::support;

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use support::RedisServer;
use tollgate::{
    Algorithm, Error, Item, Limiter, RedisStore, RedisStoreBuilder, Rule, Source, Tier,
};

fn rule() -> Rule {
    Rule::new("conn", Algorithm::Gcra, [Tier::per_second(5)]).unwrap()
}

async fn checked_by_redis(store: RedisStoreBuilder) -> Limiter<RedisStore> {
    let store = store.timeout(Duration::from_secs(5)).build().await.unwrap();
    store.ping().await.expect("store answers");
    let limiter = Limiter::builder(rule()).store(store).build().unwrap();
    let decision = limiter.check("tenant", 1).await.unwrap();
    assert_eq!(decision.source(), Source::Redis);
    limiter
}

#[tokio::test]
async fn password_and_database_in_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port);
    let limiter = checked_by_redis(RedisStore::builder(&url)).await;
    let key = String::from_utf8(support::redis_keys(&limiter, "tenant").remove(0)).unwrap();
    let in_db = |db: &str| {
        server.cli(&[
            "-a",
            "s3cret",
            "--no-auth-warning",
            "-n",
            db,
            "exists",
            &key,
        ])
    };
    assert_eq!((in_db("3"), in_db("0")), ("1".into(), "0".into()));

    let wrong = RedisStore::open(&format!("redis://:nope@127.0.0.1:{}", server.port))
        .await
        .unwrap();
    let err = wrong.ping().await.unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "{err}");
}

#[tokio::test]
async fn an_acl_user() {
    let server = RedisServer::start_with(&["--user", "limiter", "on", ">pw", "~tg:*", "+@all"]);
    let url = format!("redis://limiter:pw@127.0.0.1:{}", server.port);
    checked_by_redis(RedisStore::builder(&url)).await;
}

/// A user allowed scripts but not functions: checks run as scripts, still on Redis.
#[tokio::test]
async fn an_acl_user_without_functions() {
    let server = RedisServer::start_with(&[
        "--user",
        "limiter",
        "on",
        ">pw",
        "~tg:*",
        "+@all",
        "-function",
        "-fcall",
    ]);
    let url = format!("redis://limiter:pw@127.0.0.1:{}", server.port);
    let limiter = checked_by_redis(RedisStore::builder(&url)).await;
    // Metered work too: a reservation and its commit, as scripts.
    let budget = Rule::new("budget", Algorithm::FixedWindow, [Tier::per_day(100)]).unwrap();
    let metered = Limiter::builder(budget)
        .store(limiter.store().clone())
        .build()
        .unwrap();
    let reserved = metered
        .reserve(&[Item::new("budget", "acme", 30)], None)
        .await
        .unwrap();
    let committed = metered.commit(reserved.id().unwrap(), 12).await.unwrap();
    assert_eq!(committed[0].remaining(), 88);
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}

/// A Redis beside the instance, over its Unix socket (`unix://` or `redis+unix://`).
#[tokio::test]
async fn a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock").to_string_lossy().into_owned();
    let server = RedisServer::start_with(&["--unixsocket", &socket, "--unixsocketperm", "700"]);
    let mut limiters = Vec::new();
    for (url, db) in [
        (format!("unix://{socket}"), "0"),
        (format!("redis+unix://{socket}?db=2"), "2"),
    ] {
        let limiter = checked_by_redis(RedisStore::builder(&url)).await;
        let key = String::from_utf8(support::redis_keys(&limiter, "tenant").remove(0)).unwrap();
        assert_eq!(server.cli(&["-n", db, "exists", &key]), "1", "{url}");
        limiters.push(limiter);
    }
    // Both stores' checks came over the socket.
    let clients = server.cli(&["client", "list"]);
    let checking: Vec<_> = clients
        .lines()
        .filter(|c| c.contains("cmd=fcall"))
        .collect();
    assert_eq!(checking.len(), 2, "{clients}");
    assert!(
        checking
            .iter()
            .all(|c| c.contains(&format!("addr={socket}"))),
        "{clients}"
    );

    let missing = RedisStore::open(&format!("unix://{socket}.missing"))
        .await
        .unwrap();
    assert!(matches!(missing.ping().await, Err(Error::Store { .. })));
}

#[tokio::test]
async fn tls_verified_against_a_private_ca() {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        fs::write(&path, pem).unwrap();
        path.to_string_lossy().into_owned()
    };
    let (cert, key, ca_file) = (
        write("server.crt", server_cert.pem()),
        write("server.key", server_key.serialize_pem()),
        write("ca.crt", ca.pem()),
    );
    let server = RedisServer::start_tls(&cert, &key, &ca_file);
    let url = format!("rediss://127.0.0.1:{}", server.port);
    checked_by_redis(RedisStore::builder(&url).root_certificate(ca.pem().into_bytes())).await;
    // Without the CA, the server's certificate is not trusted and nothing is sent in clear.
    let untrusted = RedisStore::open(&url).await.unwrap();
    assert!(untrusted.ping().await.is_err());
}

/// Mutual TLS: a server that asks clients for a certificate admits the store that presents
/// one its CA signed, and no other.
#[tokio::test]
async fn mutual_tls_with_a_client_certificate() {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let signed = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        // A name of its own: OpenSSL takes a certificate named as its issuer for self-signed.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = signed("127.0.0.1");
    let (client_cert, client_key) = signed("tollgate");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        fs::write(&path, pem).unwrap();
        path.to_string_lossy().into_owned()
    };
    let server = RedisServer::start_tls_with(
        &write("server.crt", &server_cert),
        &write("server.key", &server_key),
        &write("ca.crt", &ca.pem()),
        true,
    );
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let trusted = || RedisStore::builder(&url).root_certificate(ca.pem().into_bytes());
    checked_by_redis(
        trusted().client_certificate(client_cert.into_bytes(), client_key.into_bytes()),
    )
    .await;
    let anonymous = trusted().build().await.unwrap();
    assert!(
        anonymous.ping().await.is_err(),
        "a client without a certificate"
    );
}

/// Runs `n` checks of different keys at once, each in its own task spawned by one task (as a
/// server's connections are), and asserts that Redis decided them all.
async fn at_once(limiter: &Arc<Limiter<RedisStore>>, n: usize) {
    let limiter = Arc::clone(limiter);
    let spawner = tokio::spawn(async move {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move { limiter.check(&format!("t{i}"), 1).await })
            })
            .collect();
        for task in tasks {
            let decision = task.await.unwrap().unwrap();
            assert_eq!(decision.source(), Source::Redis);
        }
    });
    spawner.await.unwrap();
}

/// The first number after `field` in a section of the server's `INFO` (0 when absent).
fn info(server: &support::RedisServer, section: &str, field: &str) -> u64 {
    let text = server.cli(&["info", section]);
    let Some(line) = text.lines().find(|l| l.starts_with(field)) else {
        return 0;
    };
    let rest = line[field.len()..].trim_start_matches(|c: char| !c.is_ascii_digit());
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next();
    digits.and_then(|d| d.parse().ok()).unwrap_or(0)
}

/// On one worker thread, where Tokio runs a task woken by another right after it: the checks'
/// commands are still written together, and Redis reads them at once rather than one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn concurrent_checks_reach_redis_in_one_write() {
    let server = RedisServer::start();
    let limiter = Arc::new(checked_by_redis(RedisStore::builder(&server.url())).await);
    let before = info(&server, "stats", "total_reads_processed");
    at_once(&limiter, 64).await;
    // The checks' reads, and those of the two redis-cli connections that read the count.
    let reads = info(&server, "stats", "total_reads_processed") - before;
    assert!(reads <= 4, "Redis read 64 checks in {reads} reads");
}

/// Many checks in one pass (on a current-thread runtime, whose run queue has no bound, all
/// 600 run in one pass; a worker of the multi-thread runtime runs at most 256 before it looks
/// elsewhere): written together, all decided by Redis.
#[tokio::test]
async fn a_pass_of_600_checks_is_written_together_and_decided_by_redis() {
    let server = RedisServer::start();
    let limiter = Arc::new(checked_by_redis(RedisStore::builder(&server.url())).await);
    at_once(&limiter, 600).await;
}

/// After a flush (or a restart), every check in flight finds its function missing: one of
/// them loads the library, the others wait for it, and all are decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_that_find_the_library_missing_load_it_once() {
    let server = RedisServer::start();
    let limiter = Arc::new(checked_by_redis(RedisStore::builder(&server.url())).await);
    assert_eq!(server.cli(&["function", "flush"]), "OK");
    assert_eq!(server.cli(&["config", "resetstat"]), "OK");
    at_once(&limiter, 64).await;
    let loads = info(&server, "commandstats", "cmdstat_function|load:");
    assert_eq!(loads, 1, "{}", server.cli(&["info", "commandstats"]));
}

/// Checks whose callers' runtime shuts down while they wait (a store shared by two runtimes),
/// one written and one queued behind it: their replies come to callers that are gone, are
/// read and dropped, and the store's later checks, on the other runtime, are decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn checks_whose_runtime_ended_mid_wait_strand_no_later_check() {
    let server = RedisServer::start();
    let limiter = Arc::new(checked_by_redis(RedisStore::builder(&server.url())).await);
    let other = Arc::clone(&limiter);
    // Stopped, Redis answers nothing: the first check waits for as long as this runtime lives.
    server.pause();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut first = std::pin::pin!(other.check("first", 1));
            let mut second = std::pin::pin!(other.check("second", 1));
            // The first is written at once; the second, sent while the first waits, is
            // queued for the writer: this future ends, then the runtime.
            std::future::poll_fn(|cx| {
                assert!(first.as_mut().poll(cx).is_pending());
                assert!(second.as_mut().poll(cx).is_pending());
                std::task::Poll::Ready(())
            })
            .await;
        });
    })
    .join()
    .unwrap();
    server.resume();
    let (a, b) = tokio::join!(limiter.check("a", 1), limiter.check("b", 1));
    assert_eq!(a.unwrap().source(), Source::Redis);
    assert_eq!(b.unwrap().source(), Source::Redis);
}

/// A store whose connection was made on a runtime that then shut down (a store shared by two
/// runtimes): the connection's tasks went with it, and the store's later checks, on the other
/// runtime, connect again and are decided by Redis rather than wait for tasks that are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_connection_lost_with_its_runtime_strands_no_check() {
    let server = RedisServer::start();
    let url = server.url();
    let limiter = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(checked_by_redis(RedisStore::builder(&url)))
    })
    .join()
    .unwrap();
    // A check of one item on one server is timed by its connection's reader: with the
    // connection's tasks gone and the link not closed, these would wait forever.
    let both = async { tokio::join!(limiter.check("a", 1), limiter.check("b", 1)) };
    let (a, b) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("the checks were answered");
    assert_eq!(a.unwrap().source(), Source::Redis);
    assert_eq!(b.unwrap().source(), Source::Redis);
}

/// A server that answers nothing for 2 s (stopped): a command without a deadline of its own
/// gets an error then rather than waiting forever, and the next one connects again, on a new
/// connection, once the server answers.
#[tokio::test]
async fn a_connection_with_no_reply_for_two_seconds_is_made_again() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url()).build().await.unwrap();
    store.ping().await.unwrap();
    let connections = || info(&server, "stats", "total_connections_received");
    let before = connections();
    server.pause();
    let started = std::time::Instant::now();
    assert!(store.ping().await.is_err());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    // Not the 20 s or more of a longer response timeout (or none), whatever the load.
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    server.resume();
    store.ping().await.unwrap();
    // The store's new connection, and redis-cli's own to read the count.
    assert_eq!(connections() - before, 2);
}

/// Polled outside a Tokio runtime (here by hand, as another executor would), building a store
/// is an error that says why, not a panic.
#[test]
fn a_store_built_outside_a_runtime_is_an_error() {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    let mut context = Context::from_waker(Waker::noop());
    let building = pin!(RedisStore::open("redis://127.0.0.1:1"));
    match building.poll(&mut context) {
        Poll::Ready(Err(Error::Store { message, .. })) => {
            assert!(message.contains("Tokio runtime"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Settings that could never work are refused when the store is built, before connecting.
#[tokio::test]
async fn settings_out_of_range_are_refused() {
    let refused = |builder: RedisStoreBuilder| async move {
        match builder.build().await {
            Err(Error::Store { message, .. }) => message,
            other => panic!("expected an error, got {other:?}"),
        }
    };
    let url = "redis://127.0.0.1:1";
    let zero = Duration::ZERO;
    let message = refused(RedisStore::builder(url).timeout(zero)).await;
    assert_eq!(message, "timeout: must be longer than zero");
    let message =
        refused(RedisStore::builder(url).circuit_breaker(0, Duration::from_secs(1))).await;
    assert_eq!(message, "circuit breaker: failures must be at least 1");
    let message = refused(RedisStore::builder(url).circuit_breaker(3, zero)).await;
    assert_eq!(
        message,
        "circuit breaker: cooldown must be longer than zero"
    );
    let message = refused(RedisStore::builder(url).connections(0)).await;
    assert_eq!(message, "connections: must be at least 1");
    // A malformed URL is named, without its password.
    let message = refused(RedisStore::builder("foo://user:secret@host")).await;
    assert!(message.starts_with("foo://user:***@host: "), "{message}");
    let message = refused(RedisStore::cluster_builder::<&str>(&[])).await;
    assert_eq!(message, "a cluster needs at least one node");
}
