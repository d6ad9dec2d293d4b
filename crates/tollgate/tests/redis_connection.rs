//! Connection URLs: a password, an ACL user, a database number, TLS with a private CA.

mod support;

use std::fs;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use support::RedisServer;
use tollgate::{Algorithm, Error, Limiter, RedisStore, Rule, Source, Tier};

fn rule() -> Rule {
    Rule::new("conn", Algorithm::Gcra, [Tier::per_second(5)]).unwrap()
}

async fn checked_by_redis(store: RedisStore) -> Limiter<RedisStore> {
    store.ping().await.expect("store answers");
    let limiter = Limiter::builder(rule())
        .store(store.timeout(Duration::from_secs(5)))
        .build()
        .unwrap();
    let decision = limiter.check("tenant", 1).await.unwrap();
    assert_eq!(decision.source(), Source::Redis);
    limiter
}

#[tokio::test]
async fn password_and_database_in_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port);
    let limiter = checked_by_redis(RedisStore::open(&url).unwrap()).await;
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

    let wrong = RedisStore::open(&format!("redis://:nope@127.0.0.1:{}", server.port)).unwrap();
    let err = wrong.ping().await.unwrap_err();
    assert!(matches!(err, Error::Store { .. }), "{err}");
}

#[tokio::test]
async fn an_acl_user() {
    let server = RedisServer::start_with(&["--user", "limiter", "on", ">pw", "~tg:*", "+@all"]);
    let url = format!("redis://limiter:pw@127.0.0.1:{}", server.port);
    checked_by_redis(RedisStore::open(&url).unwrap()).await;
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
    checked_by_redis(RedisStore::open(&url).unwrap()).await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
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
    checked_by_redis(RedisStore::open_tls(&url, ca.pem().into_bytes()).unwrap()).await;
    // Without the CA, the server's certificate is not trusted and nothing is sent in clear.
    let untrusted = RedisStore::open(&url).unwrap();
    assert!(untrusted.ping().await.is_err());
}
